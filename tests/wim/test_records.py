"""Keyed JSONL records (wim/records.py) and the run directory (wim/rundir.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from wim.config import apply_overrides, config_from_dict, read_yaml
from wim.precision import pin_dtypes
from wim.records import (
    JsonlAppender,
    RecordsError,
    read_records,
    record_key,
    write_records_atomic,
)
from wim.rundir import RunDir, RunDirError, identity_sha256

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def _sample(prompt_id: str, idx: int, text: str = "") -> dict:
    return {"prompt_id": prompt_id, "sample_idx": idx, "response": text or f"r {prompt_id}/{idx}"}


def _config(overrides: list[str] | None = None):
    return config_from_dict(apply_overrides(read_yaml(QUICKSTART), overrides or []))


# --- JSONL -----------------------------------------------------------------------------------


def test_append_and_read_round_trip(tmp_path):
    path = tmp_path / "samples.jsonl"
    records = [_sample("a", 0), _sample("a", 1, "ünïcödé ✓ \"quoted\"\nnewline"),
               {"prompt_id": "b", "sample_idx": 0, "nested": {"x": [1, 2.5, None, True]}}]
    with JsonlAppender(path) as out:
        out.write(records[0])
        out.write_all(records[1:])
    assert read_records(path) == records
    # One record a line, unicode kept as is.
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3
    assert "ünïcödé" in lines[1]


def test_appender_appends_to_an_existing_file(tmp_path):
    path = tmp_path / "s.jsonl"
    with JsonlAppender(path) as out:
        out.write(_sample("a", 0))
    with JsonlAppender(path) as out:
        out.write(_sample("a", 1))
    assert [record_key(r) for r in read_records(path)] == [("a", 0), ("a", 1)]


def test_each_record_is_flushed_before_close(tmp_path):
    path = tmp_path / "s.jsonl"
    out = JsonlAppender(path)
    out.write(_sample("a", 0))
    assert read_records(path) == [_sample("a", 0)]
    out.close()


def test_missing_file_reads_as_empty(tmp_path):
    assert read_records(tmp_path / "none.jsonl") == []


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"prompt_id": "a", "sample_idx": 0}\n\n{"prompt_id": "a", "sample_idx": 1}\n')
    assert [record_key(r) for r in read_records(path)] == [("a", 0), ("a", 1)]


def test_torn_last_line_is_ignored_then_cut_off(tmp_path):
    path = tmp_path / "s.jsonl"
    with JsonlAppender(path) as out:
        out.write_all([_sample("a", 0), _sample("a", 1)])
    complete = path.read_bytes()
    # A kill in the middle of writing the third record.
    torn = json.dumps(_sample("b", 0)).encode()[:17]
    with path.open("ab") as f:
        f.write(torn)
    assert [record_key(r) for r in read_records(path)] == [("a", 0), ("a", 1)]
    # Resuming: the appender cuts the torn bytes, and the record is written whole.
    with JsonlAppender(path) as out:
        assert path.read_bytes() == complete
        out.write(_sample("b", 0))
        out.write(_sample("b", 1))
    records = read_records(path)
    assert [record_key(r) for r in records] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert records[2] == _sample("b", 0)
    assert path.read_bytes() == complete + b"".join(
        (json.dumps(_sample("b", i)) + "\n").encode() for i in (0, 1)
    )


def test_torn_complete_json_without_newline_is_also_cut(tmp_path):
    # Even a line that happens to parse is not finished until its newline is written.
    path = tmp_path / "s.jsonl"
    path.write_bytes((json.dumps(_sample("a", 0)) + "\n" + json.dumps(_sample("a", 1))).encode())
    assert [record_key(r) for r in read_records(path)] == [("a", 0)]
    with JsonlAppender(path) as out:
        out.write(_sample("a", 1))
    assert [record_key(r) for r in read_records(path)] == [("a", 0), ("a", 1)]


def test_file_holding_only_a_torn_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"prompt_id": "a", "sam')
    assert read_records(path) == []
    with JsonlAppender(path) as out:
        out.write(_sample("a", 0))
    assert read_records(path) == [_sample("a", 0)]
    assert path.read_text().count("\n") == 1


def test_malformed_line_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "judgements.jsonl"
    path.write_text(
        json.dumps(_sample("a", 0)) + "\n"
        + json.dumps(_sample("a", 1)) + "\n"
        + '{"prompt_id": "a", "sample_\n'
        + json.dumps(_sample("a", 3)) + "\n"
    )
    with pytest.raises(RecordsError) as info:
        read_records(path)
    message = str(info.value)
    assert str(path) in message
    assert "line 3" in message


def test_write_records_atomic_replaces_the_file(tmp_path):
    path = tmp_path / "scores.jsonl"
    write_records_atomic(path, [_sample("a", 0), _sample("a", 1), _sample("a", 2)])
    assert len(read_records(path)) == 3
    write_records_atomic(path, (r for r in [_sample("z", 9)]))
    assert read_records(path) == [_sample("z", 9)]
    assert [p.name for p in tmp_path.iterdir()] == ["scores.jsonl"]  # no .tmp left behind
    write_records_atomic(path, [])
    assert path.read_bytes() == b""


def test_record_key_normalizes_types():
    assert record_key({"prompt_id": 7, "sample_idx": "2"}) == ("7", 2)


# --- the run directory -----------------------------------------------------------------------


def test_claim_creates_folder_and_saves_config(tmp_path):
    run = RunDir(tmp_path / "run")
    cfg = _config()
    run.claim(cfg)
    meta = yaml.safe_load(run.config_file.read_text())
    # Saved with its `auto` dtypes resolved on this machine (wim/precision.py).
    pinned = pin_dtypes(cfg)
    assert pinned != cfg and pinned.policy.dtype in ("float32", "bfloat16")
    assert meta["sha256"] == pinned.sha256()
    assert meta["data_sha256"] == identity_sha256(cfg)
    assert meta["shard"] is None
    assert "versions" in meta and "git_sha" in meta
    assert run.load_config() == pinned


def test_claim_again_with_the_same_config(tmp_path):
    run = RunDir(tmp_path / "run")
    run.claim(_config())
    run.claim(_config())
    assert run.load_config() == pin_dtypes(_config())


def test_claim_refuses_a_changed_data_section(tmp_path):
    run = RunDir(tmp_path / "run")
    run.claim(_config())
    with JsonlAppender(run.samples) as out:
        out.write_all([_sample("a", 0), _sample("a", 1)])
    before = {p.name: p.read_bytes() for p in run.path.iterdir()}
    with pytest.raises(RunDirError) as info:
        run.claim(_config(["generation.k=3"]))
    message = str(info.value)
    assert "generation.k" in message
    assert str(run.path) in message
    assert "Nothing was written" in message
    assert {p.name: p.read_bytes() for p in run.path.iterdir()} == before


def test_claim_names_every_changed_key(tmp_path):
    run = RunDir(tmp_path / "run")
    run.claim(_config())
    with pytest.raises(RunDirError) as info:
        run.claim(_config(["seed=3", "judge.mode=numeric", "generation.temperature=0.5"]))
    message = str(info.value)
    for key in ("seed", "judge.mode", "generation.temperature"):
        assert key in message
    assert "generation.k" not in message


def test_claim_refuses_another_shard(tmp_path):
    run = RunDir(tmp_path / "run")
    run.claim(_config(), shard="0/2")
    with pytest.raises(RunDirError, match="shard"):
        run.claim(_config(), shard="1/2")
    assert run.shard() == "0/2"


def test_claim_accepts_a_zeta_change(tmp_path):
    run = RunDir(tmp_path / "run")
    run.claim(_config())
    with JsonlAppender(run.samples) as out:
        out.write(_sample("a", 0))
    samples = run.samples.read_bytes()
    new = _config(["scoring.zeta=1", "dpo.max_steps=3", "pairs.tie_policy=first"])
    run.claim(new)
    # The saved config changes only once the new stages succeed (the CLI then saves it).
    assert run.load_config() == pin_dtypes(_config())
    run.save_config(new)
    assert run.load_config() == pin_dtypes(new)
    assert run.load_config().scoring.zeta == 1.0
    assert run.samples.read_bytes() == samples


def test_load_config_of_an_empty_folder(tmp_path):
    with pytest.raises(RunDirError, match="no resolved_config.yaml"):
        RunDir(tmp_path).load_config()


def test_disk_full_mid_append_keeps_the_records_already_written(tmp_path, monkeypatch) -> None:
    import errno

    import pytest

    from wim.records import JsonlAppender, StorageError, read_records

    path = tmp_path / "samples.jsonl"
    with JsonlAppender(path) as out:
        out.write_all([{"prompt_id": "a", "sample_idx": 0}])
        real_write = out._file.write

        def half_then_full(data):  # a real partial write, then the disk is full
            real_write(bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(out._file, "write", half_then_full)
        with pytest.raises(StorageError) as info:
            out.write({"prompt_id": "b", "sample_idx": 0})
    message = str(info.value)
    assert str(path) in message and "disk is full" in message and "run the same command" in message
    assert read_records(path) == [{"prompt_id": "a", "sample_idx": 0}]
    with JsonlAppender(path) as out:  # the next run cuts the torn line and goes on
        out.write_all([{"prompt_id": "b", "sample_idx": 0}])
    assert [r["prompt_id"] for r in read_records(path)] == ["a", "b"]


def test_disk_full_while_replacing_a_derived_file_keeps_the_old_one(tmp_path, monkeypatch) -> None:
    import errno
    import os

    import pytest

    from wim.records import StorageError, read_records, write_records_atomic

    path = tmp_path / "scores.jsonl"
    write_records_atomic(path, [{"prompt_id": "a", "sample_idx": 0}])

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageError, match="disk is full"):
        write_records_atomic(path, [{"prompt_id": "z", "sample_idx": 9}])
    assert read_records(path) == [{"prompt_id": "a", "sample_idx": 0}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.jsonl"]
