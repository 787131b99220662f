"""The `blind:` and `eval:` config sections and `prompts.holdout` (wim/config_checks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from wim.config import ConfigError, apply_overrides, config_from_dict, read_yaml

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def _with(overrides: list[str]):
    return config_from_dict(apply_overrides(read_yaml(QUICKSTART), overrides), source="q.yaml")


def test_defaults_are_the_bundled_pairwise_evaluator():
    cfg = _with([])
    assert cfg.blind.model == "bundled:smollm2-135m-instruct"
    # The quickstart holds out 16 prompts and evaluates in `wim run`; compare defaults to 50.
    assert (cfg.blind.backend, cfg.blind.mode, cfg.prompts.holdout) == ("transformers",
                                                                         "pairwise", 16)
    assert cfg.eval.in_run is True and cfg.eval.compare_holdout == 50
    assert cfg.eval.compare_zetas == [0.4]
    assert _with(["eval.in_run=false"]).eval.in_run is False


@pytest.mark.parametrize("override, key", [
    ("blind.mode=listwise", "blind.mode"),
    ("blind.backend=vllm", "blind.backend"),
    ("blind.max_retries=-1", "blind.max_retries"),
    ("blind.max_new_tokens=0", "blind.max_new_tokens"),
    ("prompts.holdout=-2", "prompts.holdout"),
    ("eval.compare_zetas=[0.4, 1.5]", "eval.compare_zetas"),
    ("eval.limit=0", "eval.limit"),
    ("blind.backend=http", "blind.http.base_urls"),
    ("blind.http.timeout=3", "blind.http.timeout"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        _with([override])


def test_blind_http_settings_are_its_own():
    cfg = _with(["blind.backend=http", "blind.http.base_urls=[http://e:1/v1]",
                 "blind.http.model=judge"])
    assert cfg.blind.http.base_urls == ["http://e:1/v1"] and cfg.http.base_urls == []
