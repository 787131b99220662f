"""The run directory under real accidents, end to end with the real CLI and bundled models:
two commands at once, a rerun of a finished run, a killed training, an overlong prompt."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICKSTART, ROOT, SHRUNK, sets

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
    while loser is None:  # the loser must end long before the winner has generated anything
        loser = next((p for p in procs if p.poll() is not None), None)
        assert time.monotonic() - start < 120
        time.sleep(0.05)
    loser_seconds = time.monotonic() - start
    [winner] = [p for p in procs if p is not loser]
    winner_out, winner_err = winner.communicate(timeout=900)
    loser_err = loser.stderr.read()
    assert winner.returncode == 0, winner_err[-3000:]
    assert loser.returncode == 2 and "Traceback" not in loser_err
    assert f"in use by process {winner.pid}" in loser_err
    assert loser_seconds < 60
    for name in ("samples.jsonl", "judgements.jsonl", "scores.jsonl"):
        records = read_keyed(out / name)  # raises if any key appears twice
        assert len(records) == 4, name
