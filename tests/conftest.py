"""Shared fixtures: a shrunk quickstart config on the real bundled models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"

# 4 prompts, 2 samples, 16 new tokens, 2 DPO steps: every stage for real, in about a minute.
SHRUNK = [
    "prompts.limit=4",
    "generation.max_new_tokens=16",
    "generation.batch_size=2",
    "judge.max_new_tokens=24",
    "judge.max_retries=1",
    "dpo.max_steps=2",
    "dpo.per_device_train_batch_size=2",
    "dpo.max_length=128",
]


def sets(overrides: list[str]) -> list[str]:
    out = []
    for item in overrides:
        out += ["--set", item]
    return out


def run_wim(args: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (as a user would)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "wim", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"wim {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="session")
def quickstart() -> Path:
    return QUICKSTART
