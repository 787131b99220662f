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
# The dtype is pinned: these tests compare greedy texts of different loading paths.
SETTINGS = ["judge.max_new_tokens=24", "judge.max_retries=0", "judge.batch_size=4",
            "policy.dtype=float32"]


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
def test_adapter_comes_through_the_peft_integration_and_stays_on(trained_adapter) -> None:
    """The loading path this file is about: not a PeftModel (no peft `disable_adapter()`), and
    after a fixed-judge pass the policy samples with its adapter on again, as before."""
    from wim.backends import SamplingParams

    res = Resources(load_config(QUICKSTART, [f"policy.adapter={trained_adapter}", *SETTINGS]))
    try:
        policy = res.policy()
        assert not hasattr(policy.model, "disable_adapter")
        assert any("lora_" in name for name, _ in policy.model.named_modules())
        conv, greedy = [[{"role": "user", "content": ITEMS[1][0]}]], SamplingParams(16, 0.0)
        before = policy.generate(conv, greedy)[0][0].text
        grads = [p.requires_grad for p in policy.model.parameters()]
        res.judge().judge(ITEMS[:1])  # role fixed: adapters off, then on again
        assert policy.generate(conv, greedy)[0][0].text == before
        assert [p.requires_grad for p in policy.model.parameters()] == grads
    finally:
        res.close()
