"""Weighted verdicts on the transformers backend: the probabilities the guided step records are
the model's own distribution over the allowed verdict tokens at the verdict position, computed
here again from a plain forward pass of the same model."""

from __future__ import annotations

import math

import pytest
import torch

from wim.backends import SamplingParams, TransformersBackend
from wim.blind import REASON_PREFILL, BlindEvaluator, build_pair_messages

QUESTIONS = ["What is 2 + 2?", "Name a colour of the sky.", "Why do leaves fall in autumn?"]
FIRST = ["4", "Blue, on a clear day.", "Trees shed them to save water in winter."]
SECOND = ["5, I think", "Green", "Because of gravity, mostly, and wind."]


@pytest.mark.slow
def test_guided_verdict_probabilities_are_the_models_distribution():
    # float32: the recorded log-probs (generate, from the cache) are compared with one fresh
    # forward to 2e-3; in bfloat16 the two paths round differently (0.05 apart seen).
    backend = TransformersBackend.load("bundled:smollm2-135m-instruct", batch_size=3,
                                       dtype="float32")
    tok, model = backend.tokenizer, backend.model
    convs = [build_pair_messages(q, a, b) for q, a, b in zip(QUESTIONS, FIRST, SECOND, strict=True)]
    params = SamplingParams(48, 0.0, guide_label="Verdict:", guide_choices=("A", "B", "tie"),
                            top_logprobs=8)
    outs = [c[0] for c in backend.generate(convs, params, prefill=REASON_PREFILL)]
    allowed = sorted({tok.encode(p + c, add_special_tokens=False)[0]
                      for c in ("A", "B", "tie") for p in ("", " ")})
    for conv, out in zip(convs, outs, strict=True):
        marked = [i for i, top in enumerate(out.top_logprobs) if top]
        assert len(marked) == 1 and len(out.top_logprobs) == out.completion_tokens
        recorded = out.top_logprobs[marked[0]]
        # The same position again: the prompt, the prefill and the text before the value.
        # (The label "Verdict:" was forced; the value's first token may carry the space.)
        value = out.text.rsplit("Verdict:", 1)[1]
        head = out.text[: len(out.text) - len(value)]
        ids = tok(backend.render(conv, REASON_PREFILL) + head, add_special_tokens=False,
                  return_tensors="pt").input_ids
        with torch.inference_mode():
            logits = model(ids).logits[0, -1].float()
        expected = torch.log_softmax(logits[allowed], dim=-1).tolist()
        assert recorded.keys() == {tok.decode([t]) for t in allowed}
        for t, lp in zip(allowed, expected, strict=True):
            assert recorded[tok.decode([t])] == pytest.approx(lp, abs=2e-3)
        assert value.strip().startswith(max(recorded, key=recorded.get).strip())
    # Through the evaluator: each order's probabilities, and p from both orders.
    verdicts = BlindEvaluator(backend).pairwise(QUESTIONS, FIRST, SECOND)
    for v in verdicts:
        assert v.sources == ("guided", "guided")
        p_ab, p_ba = v.order_preferences
        assert p_ab == pytest.approx(v.probs[0]["A"] + v.probs[0]["tie"] / 2)
        assert p_ba == pytest.approx(v.probs[1]["B"] + v.probs[1]["tie"] / 2)
        assert v.preference == pytest.approx((p_ab + p_ba) / 2)
        assert all(math.isclose(sum(p.values()), 1.0) for p in v.probs)


def test_verdict_probabilities_find_the_verdict_position():
    from wim.blind_verdicts import verdict_probabilities

    lp = math.log
    reason = {" A": lp(0.5), " B": lp(0.4), " the": lp(0.1)}  # "Answer A is ..." in the reason
    verdict = {"A": lp(0.2), "B": lp(0.5), "t": lp(0.2), "tie": lp(0.1)}
    after = {'"}': 0.0, "A": -9999.0, "B": -9999.0}  # masked by the guide
    got = verdict_probabilities((reason, {}, verdict, after), "B")
    assert got == {"A": pytest.approx(0.2), "B": pytest.approx(0.5), "tie": pytest.approx(0.3)}
    # A sampled retry wrote "A", not the most likely "B": still that position.
    assert verdict_probabilities((reason, verdict, after), "A") == got
    # A peaked distribution listing one choice; none at all; no verdict parsed.
    assert verdict_probabilities(({" A": 0.0, ".": -30.0},), "A") == {"A": 1.0, "B": 0.0,
                                                                       "tie": 0.0}
    assert verdict_probabilities((), "A") is None
    assert verdict_probabilities((verdict,), None) is None
