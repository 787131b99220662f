"""The `training` section's checks and errors: clear messages, exit 2, nothing deep."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import QUICKSTART, run_wim, sets

from wim.config import ConfigError, load_config


@pytest.mark.parametrize("overrides, key", [
    (["training.rounds=0"], "training.rounds"),
    (["training.mode=offpolicy"], "training.mode"),
    (["training.adapter=reuse"], "training.adapter"),
    (["training.online_tie_policy=random"], "training.online_tie_policy"),
    (["training.rounds=2", "policy.backend=llama_cpp"], "training.rounds"),
    (["training.mode=online", "judge.role=external", "judge.model=x"], "training.mode"),
    # An http policy's later rounds need the server to serve the trained adapters.
    (["training.rounds=2", "policy.backend=http", "http.base_urls=[http://h/v1]"],
     "training.rounds"),
    (["http.adapter_serving=vllm"], "http.adapter_serving"),
    (["http.adapter_serving=sglang", "policy.backend=http", "http.base_urls=[http://h/v1]"],
     "http.adapter_serving"),
    (["judge.role=fixed", "judge.http.base_urls=[http://judge/v1]"], "judge.http"),
])
def test_bad_training_values_name_the_key(overrides, key) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(QUICKSTART, overrides)


def test_rounds_with_an_http_policy_whose_server_serves_the_adapters() -> None:
    cfg = load_config(QUICKSTART, ["training.rounds=2", "policy.backend=http",
                                   "http.base_urls=[http://h/v1]", "http.adapter_serving=vllm"])
    assert cfg.training.rounds == 2 and cfg.http.adapter_serving == "vllm"


def test_defaults_are_one_offline_round() -> None:
    cfg = load_config(QUICKSTART)
    assert (cfg.training.rounds, cfg.training.mode, cfg.training.load_in_4bit) == (1, "offline",
                                                                                   False)


def test_four_bit_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the error is for machines without one")
    proc = run_wim(["run", str(QUICKSTART), "--out", str(tmp_path / "r"), "--no-progress",
                    *sets(["prompts.limit=2", "training.load_in_4bit=true"])], check=False)
    assert proc.returncode == 2
    assert "training.load_in_4bit needs a CUDA GPU" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_single_stage_on_a_rounds_run_points_at_a_round(tmp_path: Path) -> None:
    proc = run_wim(["generate", str(QUICKSTART), "--out", str(tmp_path / "r"),
                    "--set", "training.rounds=2"], check=False)
    assert proc.returncode == 2 and "rounds/1" in proc.stderr
