"""The run directory under real accidents, end to end with the real CLI and bundled models:
two commands at once, a rerun of a finished run, a killed training, an overlong prompt."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICKSTART, ROOT, SHRUNK, finished_run_command, run_wim, sets

from wim.cli import main
from wim.records import read_keyed


def _start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "-m", "wim", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_identical_runs_at_once_one_runs_the_other_fails_at_once(tmp_path: Path) -> None:
    out = tmp_path / "fresh"
    cmd = ["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
           *sets([*SHRUNK, "prompts.limit=2"])]
    procs = [_start(cmd), _start(cmd)]
    start = time.monotonic()
    loser = None
    while loser is None:
        loser = next((p for p in procs if p.poll() is not None), None)
        assert time.monotonic() - start < 600, "neither command ended"  # a hang guard only
        time.sleep(0.05)
    [winner] = [p for p in procs if p is not loser]
    # The loser did not wait for the lock: it ended while the winner was still at work, and
    # before the winner had written a single sample.
    assert winner.poll() is None
    assert not (out / "samples.jsonl").exists() or not read_keyed(out / "samples.jsonl")
    winner_out, winner_err = winner.communicate(timeout=1800)
    loser_err = loser.stderr.read()
    assert winner.returncode == 0, winner_err[-3000:]
    assert loser.returncode == 2 and "Traceback" not in loser_err
    assert f"in use by process {winner.pid}" in loser_err
    for name in ("samples.jsonl", "judgements.jsonl", "scores.jsonl"):
        records = read_keyed(out / name)  # raises if any key appears twice
        assert len(records) == 4, name


@pytest.fixture
def finished(finished_run: Path) -> tuple[Path, list[str]]:
    """The session's finished run (tests/conftest.py) and the command that made it."""
    return finished_run, finished_run_command(finished_run)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _count_model_loads(monkeypatch) -> list[str]:
    """Every `PreTrainedModel.from_pretrained` from now on, by class name (the test's list)."""
    from transformers import PreTrainedModel

    loads: list[str] = []
    real = PreTrainedModel.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        loads.append(cls.__name__)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(counted))
    return loads


@pytest.mark.slow
def test_rerun_of_a_finished_run_redoes_nothing(finished, tmp_path: Path, monkeypatch,
                                                 capsys, caplog) -> None:
    original, cmd = finished
    out = tmp_path / "again"
    shutil.copytree(original, out)
    cmd = [out if arg == str(original) else arg for arg in cmd]
    adapter = out / "train" / "adapter" / "adapter_model.safetensors"
    before = {p: _sha(p) for p in out.rglob("*.jsonl")} | {adapter: _sha(adapter)}
    scores_before = (out / "scores.jsonl").read_bytes()
    # In this process, to count every model load (policy, judge, embedder: all of them go
    # through transformers' `from_pretrained`).
    loads = _count_model_loads(monkeypatch)
    caplog.set_level(logging.INFO)
    assert main([str(a) for a in cmd]) == 0
    log = capsys.readouterr().err + caplog.text
    assert "skipped" in log
    for stage in ("generate", "judge", "score", "pairs", "train", "report"):
        assert f"stage {stage}: config and inputs unchanged" in log
    assert {p: _sha(p) for p in before} == before  # the adapter is the same file
    assert loads == []  # no model was loaded
    # Scores gone, similarities stored: scored again without loading the embedder.
    (out / "scores.jsonl").unlink()
    assert main(["score", str(out), "--no-progress"]) == 0
    assert loads == [] and (out / "scores.jsonl").read_bytes() == scores_before
    # The counter counts: a stage whose inputs are gone loads its model again (the embedder).
    (out / "scores.jsonl").unlink()
    (out / "similarities.sqlite").unlink()
    assert main(["score", str(out), "--no-progress"]) == 0
    assert loads
    # A downstream change reruns only what depends on it: the pairs, training and report.
    proc = run_wim(["pairs", str(out), "--set", "pairs.strategy=best_vs_random"])
    assert "stage pairs: config and inputs unchanged" not in proc.stderr


@pytest.mark.slow
def test_killed_training_resumes_from_its_last_checkpoint(finished, tmp_path: Path) -> None:
    original, _ = finished
    out = tmp_path / "train"
    shutil.copytree(original, out)
    shutil.rmtree(out / "train")  # its checkpoint-2 (the end of that 2-step run) would fool us
    cmd = ["train", str(out), "--no-progress", "--set", "dpo.max_steps=4",
           "--set", "dpo.save_steps=2"]
    proc = _start(cmd)
    state = out / "train" / "trainer" / "checkpoint-2" / "trainer_state.json"
    deadline = time.monotonic() + 600
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert state.exists() and not (out / "train" / "trainer" / "checkpoint-4").exists()
    run_wim(cmd)
    metrics = json.loads((out / "train" / "metrics.json").read_text())
    assert metrics["train/resumed_from_step"] == 2 and metrics["train/steps"] == 4
    history = json.loads((out / "train" / "log_history.json").read_text())
    assert [h["step"] for h in history if "loss" in h] == [1, 2, 3, 4]
    assert metrics["train/lora_delta_norm"] > 0
    # Another config never resumes those checkpoints: it starts over.
    run_wim(["train", str(out), "--no-progress", "--set", "dpo.max_steps=2",
             "--set", "dpo.save_steps=2"])
    metrics = json.loads((out / "train" / "metrics.json").read_text())
    assert metrics["train/resumed_from_step"] == 0 and metrics["train/steps"] == 2
