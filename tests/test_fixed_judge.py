"""The fixed judge is the frozen base model, on the path wim really loads a policy with a trained
adapter (`policy.adapter` -> load_causal_lm -> transformers' `load_adapter`), not on a PeftModel
built by hand."""

from __future__ import annotations

import pytest
from conftest import QUICKSTART

from data_gen.pipeline import Resources
from wim.config import load_config

ITEMS = [("Why is the sky blue?", "Because of the sun."),
         ("How many legs does a spider have?", "Six, I think."),
         ("What is the capital of Italy?", "Milan is the capital of Italy.")]
SETTINGS = ["judge.max_new_tokens=24", "judge.max_retries=0", "judge.batch_size=4"]


def _raw_judgements(overrides: list[str]) -> list[str]:
    res = Resources(load_config(QUICKSTART, SETTINGS + overrides))
    try:
        return [j.raw for j in res.judge().judge(ITEMS, seed=0)]  # greedy first attempt
    finally:
        res.close()


@pytest.mark.slow
def test_fixed_judge_is_the_base_model_and_changing_judge_moves(trained_adapter) -> None:
    adapter = f"policy.adapter={trained_adapter}"
    base = _raw_judgements(["judge.role=changing"])  # no adapter: the base model judges
    fixed = _raw_judgements([adapter, "judge.role=fixed"])
    changing = _raw_judgements([adapter, "judge.role=changing"])
    assert fixed == base
    assert changing != base  # the trained adapter is on for the changing judge


@pytest.mark.slow
def test_adapter_is_attached_through_the_peft_integration(trained_adapter) -> None:
    """The loading path this test file is about: not a PeftModel, so peft's disable_adapter()
    context is absent and the fixed judge must use disable_adapters()/enable_adapters()."""
    res = Resources(load_config(QUICKSTART, [f"policy.adapter={trained_adapter}"]))
    model = res.policy().model
    assert not hasattr(model, "disable_adapter")
    assert model.active_adapters() == ["default"]
