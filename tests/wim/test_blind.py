"""The blind evaluator (wim/blind.py): parsing, both orders, retries, and what it sends."""

from __future__ import annotations

import re

import pytest
from recording_server import RecordingServer

from wim.blind import (
    BlindEvaluator,
    build_pair_messages,
    load_blind_template,
    open_blind_evaluator,
    parse_score,
    parse_verdict,
)
from wim.blind_verdicts import combine_orders
from wim.config import BlindConfig, Config, EndpointConfig


@pytest.mark.parametrize("text, value", [
    ("Reason: B is wrong.\nVerdict: A", "A"),
    ("Reason: fine\nVerdict: B.", "B"),
    ("**Verdict:** B", "B"),
    ("Verdict: tie", "tie"),
    ("Verdict: a tie", "tie"),
    ("Verdict: Equal", "tie"),
    # A restated format line comes first; the last label counts.
    ("Verdict: <A if Answer A is better, B if ...>\nReason: x\nVerdict: B", "B"),
])
def test_parse_verdict(text, value):
    assert parse_verdict(text) == (value, None)


@pytest.mark.parametrize("text, reason", [
    ("Answer A is better.", "no 'Verdict:' line"),
    ("Verdict: C", "is not A, B or tie"),
    ("Verdict: a", "is not A, B or tie"),
    ("Verdict: A\nVerdict: maybe", "is not A, B or tie"),
])
def test_unparseable_verdicts_fail_with_a_reason(text, reason):
    value, error = parse_verdict(text)
    assert value is None and reason in error


@pytest.mark.parametrize("text, value", [("Reason: ok\nScore: 7", 7), ("Score: 10/10", 10),
                                         ("score = 1", 1)])
def test_parse_score(text, value):
    assert parse_score(text) == (value, None)


@pytest.mark.parametrize("text", ["Score: 0", "Score: 11", "Score: 7.5", "Score: seven", "7"])
def test_bad_scores_fail(text):
    assert parse_score(text)[0] is None


def test_both_orders_must_agree_for_a_winner():
    # first: a shown as A; second: b shown as A.
    assert combine_orders("A", "B") == "a"
    assert combine_orders("B", "A") == "b"
    assert combine_orders("A", "A") == "tie"  # position bias: says "first" both times
    assert combine_orders("B", "B") == "tie"
    assert combine_orders("tie", "B") == "tie"
    assert combine_orders("tie", "tie") == "tie"


def _answers(user: str) -> tuple[str, str]:
    m = re.search(r"Answer A:\n(.*)\n\nAnswer B:\n(.*)\Z", user, re.S)
    return m.group(1), m.group(2)


def _pair_reply(messages: list[dict]) -> str:
    """Prefers the answer holding GOOD; with none, always says A (pure position bias)."""
    user = messages[-1]["content"]
    if "UNPARSEABLE" in user:
        return "I cannot decide."
    if "PLACEHOLDER" in user:  # copies the template's format line, as the 135M model does
        return "Reason: <one short sentence>\nVerdict: A"
    if "TIE" in user:
        return "Reason: same.\nVerdict: tie"
    if "Answer A:" not in user:  # pointwise
        return "Reason: ok\nScore: 9" if "GOOD" in user else "Reason: meh\nScore: 2"
    first, second = _answers(user)
    return "Reason: x\nVerdict: " + ("B" if "GOOD" in second and "GOOD" not in first else "A")


@pytest.fixture
def recorder():
    server = RecordingServer(_pair_reply)
    try:
        yield server
    finally:
        server.close()


def _evaluator(url: str, mode: str = "pairwise", retries: int = 2) -> BlindEvaluator:
    cfg = Config(blind=BlindConfig(backend="http", mode=mode, max_retries=retries,
                                   http=EndpointConfig(base_urls=[url], model="judge-x",
                                                       max_retries=0)))
    return open_blind_evaluator(cfg)


def test_pairwise_over_a_real_server_sends_only_template_question_and_answers(recorder):
    questions = ["What is 2 + 2?", "Name a prime.", "Why is the sky blue? UNPARSEABLE"]
    a = ["GOOD: 4", "9", "Rayleigh scattering."]
    b = ["5", "GOOD: 7", "Because."]
    verdicts = _evaluator(recorder.url).pairwise(questions, a, b)
    assert [v.winner for v in verdicts[:2]] == ["a", "b"]
    # An unparseable verdict is retried (2 retries, each order), then a failure, not a win.
    assert verdicts[2].winner is None and "after 3 attempts" in verdicts[2].failure
    assert len(verdicts[2].raw) == 6 and verdicts[0].tokens == 2 * 14
    assert len(recorder.bodies) == 2 * 2 + 2 * 3
    # Every request is exactly the template plus one question and its two answers, in one of
    # the two orders: nothing else reaches the evaluator.
    allowed = set()
    for q, x, y in zip(questions, a, b, strict=True):
        allowed.add(str(build_pair_messages(q, x, y)))
        allowed.add(str(build_pair_messages(q, y, x)))
    for body in recorder.bodies:
        assert str(body["messages"]) in allowed
        assert body["messages"][0]["content"] == load_blind_template("pairwise")
    orders = {tuple(_answers(r["messages"][-1]["content"])) for r in recorder.bodies}
    assert ("GOOD: 4", "5") in orders and ("5", "GOOD: 4") in orders


def test_position_bias_becomes_a_tie(recorder):
    verdicts = _evaluator(recorder.url).pairwise(["Q?"], ["one"], ["two"])
    assert verdicts[0].winner == "tie" and verdicts[0].failure is None
    assert len(recorder.bodies) == 2
    # Both orders kept: "A" both times is a for the first order and b for the second.
    assert verdicts[0].orders == ("a", "b") and verdicts[0].tie_kind == "order_disagreement"


def test_tie_kinds_real_disagreement_identical(recorder):
    verdicts = _evaluator(recorder.url).pairwise(["TIE?", "Q?", "R?"], ["x", "one", "same"],
                                                 ["y", "two", "same"])
    assert [v.tie_kind for v in verdicts] == ["real", "order_disagreement", "identical"]
    assert verdicts[0].orders == ("tie", "tie")


def test_a_copied_placeholder_is_a_failed_verdict_retried_and_counted(recorder):
    assert parse_verdict("Reason: <one short sentence>\nVerdict: A") == (
        None, "copied the template placeholder '<one short sentence>'")
    assert parse_score("Reason: <One short sentence>\nScore: 7")[0] is None
    assert parse_verdict("Reason: fine.\nVerdict: A") == ("A", None)
    verdicts = _evaluator(recorder.url, retries=1).pairwise(["PLACEHOLDER?"], ["x"], ["y"])
    assert verdicts[0].winner is None and "placeholder" in verdicts[0].failure
    assert len(recorder.bodies) == 2 * 2  # each order asked again once


def test_identical_answers_tie_without_a_call(recorder):
    verdicts = _evaluator(recorder.url).pairwise(["Q?", "R?"], ["same ", "x"], ["same", "GOOD"])
    assert verdicts[0].winner == "tie" and verdicts[0].raw == [] and verdicts[0].tokens == 0
    assert verdicts[1].winner == "b"
    assert len(recorder.bodies) == 2  # only the second pair, in both orders


def test_pointwise(recorder):
    verdicts = _evaluator(recorder.url, "pointwise", retries=1).pointwise(
        ["Q1", "Q2", "Q3 UNPARSEABLE"], ["GOOD answer", "bad answer", "x"])
    assert verdicts[0].score == pytest.approx(8 / 9)
    assert verdicts[1].score == pytest.approx(1 / 9)
    assert verdicts[2].score is None and "after 2 attempts" in verdicts[2].failure
    assert len(verdicts[2].raw) == 2


def test_backend_failure_is_a_failure_not_a_win():
    # Nothing listens on this port: every request fails at once.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    verdicts = _evaluator(f"http://127.0.0.1:{port}/v1").pairwise(["Q"], ["a"], ["b"])
    assert verdicts[0].winner is None and "backend failed" in verdicts[0].failure


def test_public_methods_take_only_questions_and_answers():
    import inspect

    assert list(inspect.signature(BlindEvaluator.pairwise).parameters) == [
        "self", "questions", "answers_a", "answers_b"]
    assert list(inspect.signature(BlindEvaluator.pointwise).parameters) == [
        "self", "questions", "answers"]


@pytest.mark.slow
def test_bundled_local_evaluator_gives_verdicts_or_counted_failures():
    """The bundled 135M model through the guided transformers path: every verdict is a parsed
    winner or a failure with its raw texts; the prompts rendered hold only our texts."""
    from wim.backends import TransformersBackend

    backend = TransformersBackend.load("bundled:smollm2-135m-instruct", batch_size=4)
    sent = []
    real = backend.render

    def render(conversation, prefill=None):
        sent.append(conversation)
        return real(conversation, prefill)

    backend.render = render
    ev = BlindEvaluator(backend, max_retries=1, max_new_tokens=24)
    qs = ["What is the capital of France?", "How many legs does a spider have?"]
    verdicts = ev.pairwise(qs, ["Paris.", "Eight."], ["I like turtles.", "Six."])
    for v in verdicts:
        # Guided decoding restricts the value to A, B or tie, so every verdict parses.
        assert v.winner in ("a", "b", "tie") and v.failure is None, v.raw
        # "Reason:" and "Verdict:" are the evaluator's own (prefill and guide); the reason in
        # between and the letter are the model's, and the winner maps the two orders' letters
        # back to the answers (a is A in the first order, B in the second).
        assert len(v.raw) == 2 and v.tokens > 0
        found = [re.fullmatch(r"Reason:(.*\S.*)\nVerdict: (A|B|tie)", r, re.S) for r in v.raw]
        assert all(found), v.raw
        first, second = (m.group(2) for m in found)
        a_first = {"A": "a", "B": "b", "tie": "tie"}[first]
        a_second = {"A": "b", "B": "a", "tie": "tie"}[second]
        assert v.winner == (a_first if a_first == a_second else "tie"), v.raw
    allowed = {str(build_pair_messages(q, x, y)) for q, x, y in
               [(qs[0], "Paris.", "I like turtles."), (qs[0], "I like turtles.", "Paris."),
                (qs[1], "Eight.", "Six."), (qs[1], "Six.", "Eight.")]}
    assert sent and all(str(c) in allowed for c in sent)
    points = ev.pointwise(qs, ["Paris.", "Eight."])
    for p in points:
        assert p.failure is None and 0 <= p.score <= 1, p.raw
        assert re.search(r"\nScore: ([1-9]|10)$", p.raw[0]), p.raw
