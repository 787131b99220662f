"""E_L output parsing and the fixed flag rules (pure), and a failed parse is never a score."""

from __future__ import annotations

import pytest

from wim.backends import Backend, Completion
from wim.judges import Judge, Judgement
from wim.refine.evaluator import (
    LoopEvaluator,
    parse_accept_reject,
    parse_criterion,
    parse_vote,
    raise_flags,
)


@pytest.mark.parametrize("text,value", [(" 7/10", 0.7), ("7", 0.7), (" 10/10", 1.0),
                                        (" 0.35", 0.35), ("7.5", 0.75), ("** 3 / 10", 0.3)])
def test_parse_criterion(text, value):
    assert parse_criterion(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["the answer", "", "11/10", "-3", "twelve"])
def test_unparseable_criterion_is_none(text):
    assert parse_criterion(text) is None


def test_parse_accept_reject_and_vote():
    assert parse_accept_reject(" Accept.") == "accept" and parse_accept_reject("reject") == "reject"
    assert parse_accept_reject(" 1. The answer") is None
    assert parse_vote(" yes") is True and parse_vote(" no") is False
    assert parse_vote(" correct") is True and parse_vote(" Wrong.") is False
    assert parse_vote(" maybe") is None


def test_flag_rules():
    assert raise_flags("", None) == ("empty_answer",)
    assert raise_flags("It ends mid", None) == ("truncated",)
    assert raise_flags("Fine.", "The claim about X is unsupported.") == ("unsupported_claim",)
    assert raise_flags("Fine.", "It cites a wrong reference") == ("citation_mismatch",)
    assert raise_flags("Fine.", "The two parts contradict each other") == ("contradiction",)
    assert raise_flags("Fine.", "Nothing is missing.") == ()


class _Script(Backend):
    """Answers each generate call from a script (to simulate a model that will not comply)."""

    supports_prefill = True

    def __init__(self, texts):
        self.texts = list(texts)
        self.calls = 0

    def generate(self, conversations, params, *, n=1, seed=0, prefill=None):
        self.calls += 1
        text = self.texts.pop(0) if self.texts else "nonsense"
        return [[Completion(text, 10, 2)] * n for _ in conversations]


class _NoCritique(Judge):
    def judge(self, items, seed=0):
        return [Judgement("", 5, "", True, None, 1, 0, 1, 1) for _ in items]


def test_failed_parse_is_retried_then_counted_never_scored():
    backend = _Script(["the answer"] * 100)
    ev = LoopEvaluator(backend, _NoCritique(), max_retries=2)
    [out] = ev.evaluate(["Q?"], ["A."])
    assert out.evaluation.scores is None and out.failure.startswith("factuality did not parse")
    assert out.attempts == 3


def test_parsed_scores_and_ensemble_majority_verdict():
    one_run = [" 8/10", " 6/10", " 4/10", " 2/10", " 10/10", " accept"]
    second = [" 6/10", " 6/10", " 4/10", " 2/10", " 10/10", " reject"]
    ev = LoopEvaluator(_Script(one_run + second), _NoCritique(), ensemble_n=2)
    [out] = ev.evaluate(["Q?"], ["A."])
    assert out.evaluation.scores["factuality"] == pytest.approx(0.7)
    assert out.evaluation.verdict == "reject"  # 1 accept of 2: a tie rejects


@pytest.mark.parametrize("guided", [True, False])
def test_refine_over_http_honours_judge_guided_json(guided: bool) -> None:
    """`wim refine`'s loop evaluator on an HTTP server asks for the guided JSON only while
    `judge.guided_json` is true (it once ignored the setting)."""
    from conftest import QUICKSTART
    from recording_server import RecordingServer

    from wim.config import load_config
    from wim.refine.runner import open_models

    server = RecordingServer(lambda messages: '{"missing": "A source.", "rating": 6}')
    try:
        cfg = load_config(QUICKSTART, [
            "policy.backend=http", f"http.base_urls=[{server.url}]", "http.model=m",
            "refine.evaluator=evaluator-model", "refine.evaluator_backend=http",
            f"judge.guided_json={str(guided).lower()}", "judge.max_retries=0"])
        policy, evaluator, _ = open_models(cfg)
        evaluator.judge.judge([("Name a colour.", "Blue.")], seed=0)
        policy.close()
    finally:
        server.close()
    assert server.bodies and all(("response_format" in b) == guided for b in server.bodies)
