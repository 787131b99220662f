"""dpo.reference_pass: when DPO precomputes the reference log-probabilities (a pure rule), and
that the choice reaches trl.DPOConfig."""

from __future__ import annotations

import pytest
from conftest import QUICKSTART

from training.train import _dpo_args, precompute_reference
from wim.config import ConfigError, load_config


@pytest.mark.parametrize(("overrides", "pairs", "processes", "expected"), [
    ([], 48, 1, True),  # the quickstart: 30 steps x 4 = 120 pairs seen, 48 distinct
    ([], 120, 1, False),  # one pass exactly: precomputing saves nothing
    ([], 200, 1, False),
    (["dpo.gradient_accumulation_steps=2"], 200, 1, True),
    ([], 200, 2, True),  # two processes see twice the pairs per step
    (["dpo.reference_pass=per_step"], 48, 1, False),
    (["dpo.reference_pass=precompute"], 500, 1, True),
])
def test_precompute_when_training_sees_the_pairs_more_than_once(overrides, pairs, processes,
                                                                 expected) -> None:
    cfg = load_config(QUICKSTART, overrides)
    assert precompute_reference(cfg, pairs, processes) is expected


def test_the_choice_reaches_dpo_config(tmp_path) -> None:
    cfg = load_config(QUICKSTART)
    assert _dpo_args(cfg, tmp_path, False, 48).precompute_ref_log_probs is True
    assert _dpo_args(cfg, tmp_path, False, 500).precompute_ref_log_probs is False


def test_bad_values_are_refused_by_name(tmp_path) -> None:
    with pytest.raises(ConfigError, match="dpo.reference_pass"):
        load_config(QUICKSTART, ["dpo.reference_pass=sometimes"])
    cfg = load_config(QUICKSTART, ["dpo.extra={precompute_ref_log_probs: true}"])
    with pytest.raises(ConfigError, match="dpo.reference_pass"):
        _dpo_args(cfg, tmp_path, False, 48)
