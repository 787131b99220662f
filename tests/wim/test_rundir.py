"""The run directory: one writer at a time, the run's identity, clear file-system errors."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUICKSTART, ROOT, run_wim

from wim.cli import main
from wim.config import load_config
from wim.records import RecordsError, read_keyed
from wim.rundir import RunDir, RunDirBusyError, RunDirError

HTTP = ["judge.role=external", "judge.backend=http", "http.base_urls=[http://a:1/v1, http://b:2/v1]",
        "http.model=judge-a"]


def test_second_lock_fails_at_once_and_names_the_holder(tmp_path: Path) -> None:
    """While the first lock is held, a second one raises: a lock that waited instead would
    never return inside the first's block (the thread's join timeout only guards the test
    against that hang)."""
    import threading

    run = RunDir(tmp_path / "run")
    raised: list[BaseException] = []

    def second() -> None:
        try:
            with run.lock("wim run second"):
                pass
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            raised.append(err)

    with run.lock("wim run first"):
        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the second lock waited for the first"
    [error] = raised
    assert isinstance(error, RunDirBusyError)
    message = str(error)
    assert f"process {os.getpid()}" in message and "wim run first" in message
    assert "run this command again" in message
    with run.lock("wim run third"):  # released when the first command ended
        pass


def _hold_lock(folder: Path) -> subprocess.Popen:
    code = ("import sys, time; from wim.rundir import RunDir\n"
            f"with RunDir({str(folder)!r}).lock('wim judge holder'):\n"
            "    print('locked', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_command_on_a_locked_folder_exits_2_naming_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    RunDir(out).claim(load_config(QUICKSTART))
    holder = _hold_lock(out)
    try:
        proc = run_wim(["score", str(out)], check=False)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"process {holder.pid}" in proc.stderr and "wim judge holder" in proc.stderr
    # Once the holder is gone (killed: the kernel drops its lock), the folder is free again.
    proc = run_wim(["score", str(out)], check=False)
    assert "in use" not in proc.stderr


def test_a_file_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    lines = [{"prompt_id": "a", "sample_idx": 0}, {"prompt_id": "b", "sample_idx": 0},
             {"prompt_id": "a", "sample_idx": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(RecordsError, match=r"appears twice \(records 1 and 3") as info:
        read_keyed(path)
    assert str(path) in str(info.value) and "Keep one line per key" in str(info.value)


def test_stages_refuse_a_file_with_repeated_keys(tmp_path: Path) -> None:
    out = tmp_path / "run"
    RunDir(out).claim(load_config(QUICKSTART))
    # A complete judgement, so that only the repeated key is wrong.
    record = {"prompt_id": "a", "sample_idx": 0, "response": "r", "critique": "c", "rating": 5,
              "parse_ok": True}
    (out / "judgements.jsonl").write_text((json.dumps(record) + "\n") * 2)
    proc = run_wim(["score", str(out)], check=False)
    assert proc.returncode == 2 and "appears twice" in proc.stderr


def _claim(out: Path, overrides: list[str]) -> None:
    RunDir(out).claim(load_config(QUICKSTART, overrides))


def test_changing_the_http_judge_refuses_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _claim(out, HTTP)
    for change, key in [("http.model=judge-b", "http.model"),
                        ("http.base_urls=[http://c:3/v1]", "http.base_urls"),
                        ("http.context_tokens=4096", "http.context_tokens")]:
        with pytest.raises(RunDirError, match="different config") as info:
            _claim(out, [*HTTP, change])
        assert key in str(info.value)
    # How requests are sent does not change who judges: accepted.
    _claim(out, [*HTTP, "http.concurrency=2", "http.timeout_s=5", "http.max_retries=0",
                 "http.api_key_env=OTHER_KEY", "http.base_urls=[http://b:2/v1, http://a:1/v1]"])


def test_http_keys_do_not_matter_without_an_http_backend(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _claim(out, [])
    _claim(out, ["http.model=whatever"])


def test_the_cli_refuses_another_judge_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _claim(out, HTTP)
    proc = run_wim(["judge", str(out), "--set", "http.model=judge-b"], check=False)
    assert proc.returncode == 2 and "http.model" in proc.stderr
    assert "different config" in proc.stderr


@pytest.mark.parametrize("command, needs", [("score", "wim judge"), ("pairs", "wim score"),
                                            ("judge", "wim generate"), ("report", "wim score")])
def test_a_stage_without_its_input_names_the_stage_to_run(tmp_path: Path, command: str,
                                                          needs: str) -> None:
    out = tmp_path / "run"
    RunDir(out).claim(load_config(QUICKSTART))
    proc = run_wim([command, str(out)], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"`{needs} {out}`" in proc.stderr


def _shard(out: Path, shard: str) -> None:
    RunDir(out).claim(load_config(QUICKSTART), shard=shard)
    index = shard.split("/")[0]
    record = json.dumps({"prompt_id": f"p{index}", "sample_idx": 0})
    for name in ("samples.jsonl", "judgements.jsonl"):
        (out / name).write_text(record + "\n")


def test_merge_of_an_incomplete_split_names_the_missing_shards(tmp_path: Path, capsys) -> None:
    dirs = [tmp_path / "s0", tmp_path / "s2"]
    _shard(dirs[0], "0/3")
    _shard(dirs[1], "2/3")
    assert main(["merge", *map(str, dirs), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "1/3 missing" in err and "--allow-partial" in err
    assert not (tmp_path / "m" / "samples.jsonl").exists()
    assert main(["merge", *map(str, dirs), "--out", str(tmp_path / "m"), "--allow-partial"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["missing_shards"] == ["1/3"] and summary["samples.jsonl"] == 2


def test_out_that_is_a_file(tmp_path: Path, capsys) -> None:
    out = tmp_path / "a-file"
    out.write_text("mine\n")
    assert main(["generate", str(QUICKSTART), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and str(out) in err
    assert out.read_text() == "mine\n"


def test_unwritable_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    # Tests may run as root, where permissions do not bite: the fault is simulated.
    def refuse(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    out = tmp_path / "locked" / "run"
    assert main(["generate", str(QUICKSTART), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "permission denied" in err and str(out) in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["export", "eval"])
def test_a_run_without_an_adapter_names_what_trains_it(tmp_path: Path, command: str) -> None:
    """`wim export` and `wim eval` find the run's adapter one way (RunDir.final_adapter): none
    trained is one message naming the command to run, exit 2, no traceback."""
    run = RunDir(tmp_path / "run")
    run.claim(load_config(QUICKSTART))
    args = ([command, str(run.path), "--merged", str(tmp_path / "merged")]
            if command == "export" else [command, str(run.path), "--limit", "1"])
    proc = run_wim(args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"{run.path} holds no trained adapter ({run.adapter}/adapter_config.json" in proc.stderr
    assert f"`wim train {run.path}`" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "merged").exists()
