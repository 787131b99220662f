"""DPO moves the right way: after a few real steps on pairs whose chosen side is clearly better
(correct, complete answers against garbage), the implicit reward margin on held-out pairs of the
same kind is positive.

Implicit reward of a response y: beta * (log p_policy(y | x) - log p_ref(y | x)), the reference
being the same weights with the adapter off. The control trains on the same pairs with chosen
and rejected swapped (`train_small_adapter(out, swap=True)`, same settings) and must give
negative margins (by hand once: -4.76, -5.35, -3.49): so a positive margin comes from the pairs'
direction, not from training as such, and the test fails if that direction is reversed anywhere
between pairs.jsonl and TRL.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import HELD_OUT, train_small_adapter

BETA = 0.1


def response_logprob(model, tokenizer, prompt: str, response: str) -> float:
    """Sum of log p(response tokens | chat-formatted prompt)."""
    import torch

    head = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    head_ids = tokenizer(head, add_special_tokens=False).input_ids
    ids = tokenizer(head + response, add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    targets = torch.tensor(ids[1:])
    picked = logp[torch.arange(len(targets)), targets]
    return float(picked[len(head_ids) - 1 :].sum())


def implicit_margins(adapter) -> list[float]:
    from wim.backends.transformers_backend import adapters_off
    from wim.models import BUNDLED_POLICY, load_causal_lm

    model, tokenizer = load_causal_lm(BUNDLED_POLICY, adapter=str(adapter))
    margins = []
    for prompt, good, bad in HELD_OUT:
        policy = [response_logprob(model, tokenizer, prompt, y) for y in (good, bad)]
        with adapters_off(model):
            ref = [response_logprob(model, tokenizer, prompt, y) for y in (good, bad)]
        margins.append(BETA * ((policy[0] - ref[0]) - (policy[1] - ref[1])))
    return margins


@pytest.mark.slow
def test_implicit_reward_margin_is_positive_on_held_out_pairs(trained_adapter) -> None:
    margins = implicit_margins(trained_adapter)
    assert all(m > 0 for m in margins), margins


@pytest.mark.slow
def test_reversed_pairs_give_negative_margins(tmp_path: Path) -> None:
    """The control: the same training with chosen and rejected swapped."""
    margins = implicit_margins(train_small_adapter(tmp_path, swap=True))
    assert all(m < 0 for m in margins), margins
