"""SIGKILL in the middle of judging a sourced run, then the same command: the judgements are
exactly those of an uninterrupted run, in the same order. The judge is a fast
stand-in over real HTTP with several batches in flight (http.concurrency > 1, so the stage runs
batches through data_gen/flow.ordered_map); its verdict depends on the response alone."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICKSTART, ROOT, run_wim, sets
from recording_server import RecordingServer

from wim.records import read_keyed, read_records

pytestmark = pytest.mark.slow

# 600 x 4 in the suite; WIM_KILL_RESUME_PROMPTS=10000 runs the same check at a dataset's size.
PROMPTS, RESPONSES = int(os.environ.get("WIM_KILL_RESUME_PROMPTS", "600")), 4


def _verdict(messages: list[dict]) -> str:
    """{"missing", "rating"} from a hash of the judge prompt: deterministic, varied."""
    digest = hashlib.sha256(messages[-1]["content"].encode()).digest()
    return json.dumps({"missing": f"more on point {digest[1] % 7}", "rating": digest[0] % 10 + 1})


def _source(path: Path) -> Path:
    rows = [{"id": f"p{i:04d}", "prompt": f"Question {i}: " + "why " * (i % 13),
             "responses": [f"answer {i}.{j} " + "so " * ((i * 7 + j) % 11)
                           for j in range(RESPONSES)]} for i in range(PROMPTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sigkill_while_judging_then_the_same_command(tmp_path: Path) -> None:
    server = RecordingServer(_verdict)
    try:
        overrides = sets([f"generation.source={_source(tmp_path / 'src.jsonl')}",
                          "policy.model=/nonexistent/policy", "prompts.holdout=0",
                          "judge.role=external", "judge.backend=http",
                          f"http.base_urls=[{server.url}]", "http.model=standin",
                          "http.concurrency=8", "generation.batch_size=8"])

        def command(out: Path, stage: str) -> list[str]:
            return [stage, str(QUICKSTART), "--out", str(out), "--no-progress", *overrides]

        whole = tmp_path / "whole"
        run_wim(command(whole, "generate"))
        run_wim(command(whole, "judge"))
        expected = read_records(whole / "judgements.jsonl")
        assert len(expected) == PROMPTS * RESPONSES

        killed = tmp_path / "killed"
        run_wim(command(killed, "generate"))
        file = killed / "judgements.jsonl"
        proc = subprocess.Popen([sys.executable, "-m", "wim", *command(killed, "judge")],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if file.exists() and file.stat().st_size and \
                    file.read_bytes().count(b"\n") >= len(expected) // 3:
                break
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL, "the judge finished before the kill"
        partial = len(read_keyed(file))
        assert 0 < partial < len(expected)

        run_wim(command(killed, "judge"))
        assert read_records(file) == expected  # the same records, in the same order
    finally:
        server.close()
