"""train_dpo_model end to end on the bundled SmolLM2-135M, plus its two early errors."""

from __future__ import annotations

import json
import math

import pytest

from training.train import train_dpo_model
from wim.config import Config, ConfigError
from wim.errors import InputError

PAIRS = [
    (
        "How do I boil an egg?",
        "Place the egg in boiling water for 9 minutes, then cool it in ice water for 2 minutes.",
        "Just cook it for a while until it seems done.",
    ),
    (
        "What is the boiling point of water at sea level?",
        "100 degrees Celsius (212 degrees Fahrenheit) at 1 atmosphere of pressure.",
        "It boils when it gets hot enough.",
    ),
    (
        "How many days are in a leap year?",
        "366 days: February has 29 days instead of 28.",
        "A few more than usual, I think.",
    ),
    (
        "What is the capital of France?",
        "Paris, which is also the largest city in France.",
        "Some city in Europe.",
    ),
]


def write_pairs(path, pairs=PAIRS) -> None:
    with path.open("w") as f:
        for i, (prompt, chosen, rejected) in enumerate(pairs):
            row = {
                "prompt": [{"role": "user", "content": prompt}],
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
                "prompt_id": f"test-{i:02d}",
                "chosen_score": 0.7,
                "rejected_score": 0.1,
                "chosen_critique": "Nothing is missing.",
                "rejected_critique": "Missing the concrete facts.",
            }
            f.write(json.dumps(row) + "\n")


def small_config() -> Config:
    cfg = Config()
    cfg.dpo.max_steps = 2
    cfg.dpo.per_device_train_batch_size = 2
    cfg.dpo.max_length = 96
    return cfg


@pytest.mark.slow
def test_train_dpo_saves_adapter_and_metrics(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    write_pairs(pairs)
    out = tmp_path / "train"

    metrics, _ = train_dpo_model(small_config(), pairs, out, progress=False)

    adapter = out / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    assert (adapter / "adapter_model.safetensors").is_file()
    assert metrics["train/steps"] == 2
    assert metrics["train/pairs"] == len(PAIRS)
    assert math.isfinite(metrics["train/loss_first"])
    assert math.isfinite(metrics["train/loss_last"])
    assert metrics["train/lora_delta_norm"] > 0
    assert json.loads((out / "metrics.json").read_text()) == metrics
    history = json.loads((out / "log_history.json").read_text())
    assert sum("loss" in h for h in history) == 2


def test_zero_pairs_raise_a_clear_error(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("")
    with pytest.raises(InputError, match="no preference pairs to train on: every prompt tied"):
        train_dpo_model(small_config(), pairs, tmp_path / "train")


def test_unknown_extra_key_is_named(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    write_pairs(pairs)
    cfg = small_config()
    # max_prompt_length was a DPOConfig field in older TRL; 1.16 has max_length only.
    cfg.dpo.extra = {"warmup_steps": 1, "max_prompt_length": 64}
    with pytest.raises(ConfigError, match="'max_prompt_length' is not a trl.DPOConfig field"):
        train_dpo_model(cfg, pairs, tmp_path / "train")


def test_extra_key_that_shadows_a_dpo_field_is_refused(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    write_pairs(pairs)
    cfg = small_config()
    cfg.dpo.extra = {"beta": 0.5}
    with pytest.raises(ConfigError, match="'beta' has its own key; set dpo.beta instead"):
        train_dpo_model(cfg, pairs, tmp_path / "train")


@pytest.mark.slow
def test_bfloat16_lora_layers_train_on_their_input_uncast(tmp_path, monkeypatch):
    """Under bfloat16 autocast the LoRA layers get their bfloat16 input as it is (peft would cast
    it to their float32 weights, and autocast straight back): no input is cast while training
    runs, and the losses and trained weights are bit for bit those of peft's casting."""
    import contextlib

    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer
    from safetensors.torch import load_file

    import training.train as dpo

    casts = []
    real_cast = BaseTunerLayer._cast_input_dtype

    def spy(self, x, dtype):
        out = real_cast(self, x, dtype)
        if x is not None and out is not x:
            casts.append((x.dtype, out.dtype))
        return out

    monkeypatch.setattr(BaseTunerLayer, "_cast_input_dtype", spy)
    pairs = tmp_path / "pairs.jsonl"
    write_pairs(pairs)
    cfg = small_config()
    cfg.policy.dtype = "bfloat16"
    runs = {}
    for uncast in (True, False):
        if not uncast:
            monkeypatch.setattr(dpo, "lora_inputs_uncast",
                                lambda model, args: contextlib.nullcontext())
        casts.clear()
        out = tmp_path / f"uncast-{uncast}"
        metrics, _ = train_dpo_model(cfg, pairs, out, progress=False)
        assert metrics["train/compute_dtype"] == "bfloat16"
        history = json.loads((out / "log_history.json").read_text())
        runs[uncast] = ([h["loss"] for h in history if "loss" in h],
                        load_file(out / "adapter" / "adapter_model.safetensors"), list(casts))
    assert runs[True][2] == []
    assert (torch.bfloat16, torch.float32) in runs[False][2]  # peft's cast, when left on
    assert runs[True][0] == runs[False][0]
    for name, weight in runs[True][1].items():
        assert torch.equal(weight, runs[False][1][name]), name
