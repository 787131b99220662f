"""`accelerate launch -m wim train DIR` in 2 CPU processes (gloo): both ranks step, the
main process alone writes the adapter and the stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import GOOD_VS_GARBAGE, QUICKSTART, ROOT, free_port, write_pair_rows


@pytest.mark.slow
def test_two_process_ddp_training(tmp_path: Path) -> None:
    from wim.config import load_config
    from wim.rundir import RunDir

    run = RunDir(tmp_path / "run")  # a run whose pairs came from elsewhere (8 pairs)
    run.claim(load_config(QUICKSTART))
    write_pair_rows(run.pairs, GOOD_VS_GARBAGE)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs/accelerate/ddp_cpu.yaml"), "--main_process_port",
           str(free_port()), "-m", "wim", "train", str(run.path), "--no-progress",
           "--set", "dpo.max_steps=2", "--set", "dpo.per_device_train_batch_size=2",
           "--set", "dpo.max_length=64", "--set", "dpo.save_steps=0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((run.path / "train/ranks" / f"{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["steps"] for r in ranks] == [2, 2]
    # Data-parallel: the gradients were averaged, so both ranks hold the same LoRA weights.
    assert ranks[0]["lora_checksum"] == pytest.approx(ranks[1]["lora_checksum"], rel=1e-9)
    adapters = list((run.path / "train").rglob("adapter_model.safetensors"))
    assert adapters == [run.path / "train/adapter/adapter_model.safetensors"]
    history = json.loads((run.path / "train/log_history.json").read_text())
    assert history[-1]["epoch"] == 1.0  # 2 steps x 2 pairs x 2 ranks = all 8 pairs once
    stats = json.loads((run.path / "stats/train.json").read_text())
    assert stats["train/steps"] == 2 and "fingerprint" in stats

