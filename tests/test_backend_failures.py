"""A backend failure is not a result: samples and judgements lost to a server that is down are
not recorded, and running the same command again fills them in. Real HTTP, real CLI; the
server is a small stand-in that can be switched down (the fault), not a model."""

from __future__ import annotations

import errno
import json
from pathlib import Path

from conftest import QUICKSTART, http_overrides, run_wim, sets

from wim.records import read_keyed, read_records

PROMPTS = [
    {"id": "p0", "domain": "x", "prompt": "UNPARSEABLE?"},  # shortest: batch 0
    {"id": "p1", "domain": "x", "prompt": "Why is the sky blue?"},
    {"id": "p2", "domain": "y", "prompt": "How do vaccines train the immune system?"},
    {"id": "p3", "domain": "y", "prompt": "What does a central bank do when prices rise fast?"},
]


def _prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def _stats(out: Path, stage: str) -> dict:
    return json.loads((out / "stats" / f"{stage}.json").read_text())


def test_a_server_down_for_part_of_the_run(flaky_server, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # One request at a time, so that "the first requests" the server answers are batch 0's
    # (with more in flight, the stages run later batches at the same time).
    cmd = ["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
           *sets([*http_overrides(flaky_server.url), f"prompts.source={_prompts(tmp_path)}",
                  "http.concurrency=1"])]
    # 1. The server answers the first generation batch (2 prompts x 2 samples), then is down.
    flaky_server.generate_up = 4
    first = run_wim(cmd, check=False)
    assert first.returncode == 3, first.stderr
    assert "4 samples were lost to backend failures" in first.stderr
    assert "run the same command again" in first.stderr.lower()
    assert len(read_keyed(out / "samples.jsonl")) == 4
    assert _stats(out, "generate")["generate/backend_failed"] == 4
    assert not (out / "judgements.jsonl").exists()  # nothing built on an incomplete stage
    # 2. Generation is back; the judge answers batch 0 (4 verdicts + 2 parse retries), then is
    #    down for batch 1.
    flaky_server.generate_up, flaky_server.judge_up = None, 6
    second = run_wim(cmd, check=False)
    assert second.returncode == 3, second.stderr
    assert len(read_keyed(out / "samples.jsonl")) == 8
    judge = _stats(out, "judge")
    assert judge["judge/backend_failed"] == 4 and judge["judge/parse_failed"] == 2
    judged = read_keyed(out / "judgements.jsonl")
    assert len(judged) == 4  # the lost ones are not recorded, not even as failures
    assert sum(not j["parse_ok"] for j in judged) == 2
    # 3. The server is back: the same command judges every sample and finishes.
    flaky_server.judge_up = None
    third = run_wim(cmd)
    judged = read_keyed(out / "judgements.jsonl")
    assert len(judged) == 8
    assert sum(not j["parse_ok"] for j in judged) == 2  # parse failures are final, still counted
    report = json.loads((out / "report.json").read_text())
    assert report["judge/count"] == 8 and report["judge/parse_failed"] == 2
    assert report["judge/backend_failed"] == 0
    assert "skipped" in third.stderr and "generate" in third.stderr


def test_disk_full_mid_stage_then_resume(flaky_server, tmp_path: Path, monkeypatch,
                                         capsys) -> None:
    from wim import records
    from wim.cli import main

    out = tmp_path / "run"
    cmd = ["generate", str(QUICKSTART), "--out", str(out), "--no-progress",
           *sets([*http_overrides(flaky_server.url), f"prompts.source={_prompts(tmp_path)}"])]
    real_write = records.JsonlAppender.write
    written = []

    def fill_up(self, record):
        if len(written) == 3:
            raise records.storage_error(OSError(errno.ENOSPC, "No space left on device"),
                                        self.path)
        written.append(record)
        real_write(self, record)

    monkeypatch.setattr(records.JsonlAppender, "write", fill_up)
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "disk is full" in err and str(out / "samples.jsonl") in err and "Traceback" not in err
    assert read_records(out / "samples.jsonl") == written  # what was written is intact
    monkeypatch.setattr(records.JsonlAppender, "write", real_write)
    assert main(cmd) == 0
    assert len(read_keyed(out / "samples.jsonl")) == 8


def test_disk_full_from_any_other_write_reads_like_the_rest(flaky_server, tmp_path: Path,
                                                            monkeypatch, capsys) -> None:
    """A raw OSError (as from datasets, the trainer or matplotlib) gets the same paragraph."""
    from wim.cli import main
    from wim.rundir import RunDir

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "stats"))

    monkeypatch.setattr(RunDir, "write_stats", full)
    cmd = ["generate", str(QUICKSTART), "--out", str(tmp_path / "run"), "--no-progress",
           *sets([*http_overrides(flaky_server.url), f"prompts.source={_prompts(tmp_path)}"])]
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "disk is full" in err and "Traceback" not in err


def test_a_dead_replica_among_two(flaky_server, tmp_path: Path) -> None:
    """One of two base URLs refuses connections from the start; with no retries at all
    (http.max_retries=0) the run still gets every sample and verdict, since a request that
    reached no server moves to the other URL; the dead URL's counts are in the stage stats."""
    from conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}/v1"
    out = tmp_path / "run"
    cmd = ["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
           *sets([*http_overrides(flaky_server.url), f"prompts.source={_prompts(tmp_path)}",
                  f"http.base_urls=[{flaky_server.url},{dead}]"])]
    run_wim(cmd)
    assert len(read_keyed(out / "samples.jsonl")) == 8
    assert len(read_keyed(out / "judgements.jsonl")) == 8
    for stage, role in (("generate", "policy"), ("judge", "judge")):
        stats = _stats(out, stage)
        assert stats[f"{stage}/backend_failed"] == 0
        assert stats[f"http/{role}/failures"] == 0
        assert stats[f"http/{role}/url1_down"] == 1
        assert stats[f"http/{role}/url1_requests"] == stats[f"http/{role}/failovers"] >= 1
        assert stats[f"http/{role}/url0_requests"] >= 8
