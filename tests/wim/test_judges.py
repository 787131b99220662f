"""Judges: retries, counted failures, roles, and the guided format on the real bundled model."""

from __future__ import annotations

import pytest

from wim.backends import Backend, Completion, TransformersBackend
from wim.judges import BackendJudge


class ScriptedBackend(Backend):
    """Replies from a script, to simulate a judge that breaks the format (a fault, not a model)."""

    name = "scripted"

    def __init__(self, replies: list[str], ok: bool = True) -> None:
        self.replies = list(replies)
        self.ok = ok
        self.seen_temperatures: list[float] = []
        self.seen_seeds: list[int] = []

    def generate(self, conversations, params, *, n=1, seed=0, prefill=None):
        self.seen_temperatures.append(params.temperature)
        self.seen_seeds.append(seed)
        out = []
        for _ in conversations:
            text = self.replies.pop(0) if self.replies else "still no format"
            out.append([Completion(text if self.ok else "", 10, 5, ok=self.ok,
                                   error=None if self.ok else "HTTP 500 from http://x/v1")])
        return out


def _judge(backend: Backend, **kw) -> BackendJudge:
    return BackendJudge(backend, role="external", model_name="scripted", criteria="accuracy", **kw)


def test_failed_parse_is_retried_then_recorded_as_failed() -> None:
    backend = ScriptedBackend(["no format here", "Rating: 11", "Missing: x\nRating: 7.5"])
    [result] = _judge(backend, max_retries=2).judge([("q", "a")])
    assert not result.parse_ok and result.rating is None
    assert result.critique == "x"  # what did parse is kept for audit; parse_ok says it failed
    assert result.attempts == 3
    assert result.raw == "Missing: x\nRating: 7.5"  # the raw text of the last attempt is kept
    assert "7.5" in result.error
    assert result.prompt_tokens == 30 and result.completion_tokens == 15  # all attempts paid
    # The first attempt is greedy; retries sample, since greedy would only repeat itself.
    assert backend.seen_temperatures[0] == 0.0 and backend.seen_temperatures[1] > 0


def test_each_attempt_asks_with_its_own_seed() -> None:
    """The seed scheme that batch ingestion decodes (data_gen/judge_batch.py): a changed step
    would re-seed every retry of every run, so it is pinned here."""
    backend = ScriptedBackend(["no format here", "Rating: 11", "Missing: x\nRating: 7"])
    [result] = _judge(backend, max_retries=2, retry_temperature=0.6).judge([("q", "a")], seed=5)
    assert result.attempts == 3
    assert backend.seen_seeds == [5, 5 + 7919, 5 + 2 * 7919]
    assert backend.seen_temperatures == [0.0, 0.6, 0.6]


def test_retry_that_parses_is_kept() -> None:
    backend = ScriptedBackend(["garbage", "Missing: None\nRating: 9"])
    [result] = _judge(backend, max_retries=2).judge([("q", "a")])
    assert result.parse_ok and result.rating == 9 and result.critique == ""
    assert result.attempts == 2


ECHO = "Missing: 10 = nothing is missing, 7-9 = minor points missing, 4-6 = a point\nRating: 10"


def test_echoed_rubric_is_a_parse_failure_that_is_retried() -> None:
    backend = ScriptedBackend([ECHO, "Missing: the year it happened\nRating: 6"])
    [result] = _judge(backend, max_retries=2).judge([("q", "a")])
    assert result.parse_ok and result.critique == "the year it happened" and result.attempts == 2
    assert result.echoed_attempts == 1


def test_echoed_rubric_after_retries_is_counted_with_its_own_reason() -> None:
    from wim.metrics import JudgeStatistics

    [result] = _judge(ScriptedBackend([ECHO] * 3), max_retries=2).judge([("q", "a")])
    assert not result.parse_ok and result.error == "echoed rubric" and result.critique is None
    assert result.echoed_attempts == 3
    record = {"parse_ok": result.parse_ok, "parse_error": result.error, "critique": None,
              "attempts": result.attempts, "echoed_attempts": result.echoed_attempts}
    fine = {"parse_ok": True, "parse_error": None, "critique": "x", "attempts": 1,
            "echoed_attempts": 0}
    healed = {**fine, "attempts": 2, "echoed_attempts": 1}
    counts = JudgeStatistics()
    for judgement in (record, fine, healed):
        counts.add(judgement)
    stats = counts.result()
    assert stats["judge/echoed_rubric"] == 1 and stats["judge/parse_failed"] == 1
    assert stats["judge/echoed_rubric_any_attempt"] == 2


def test_instructions_copied_into_the_critique_are_an_echo() -> None:
    copied = ("Missing: a careful, complete answer would include but this one leaves out\n"
              "Rating: 5")
    [result] = _judge(ScriptedBackend([copied]), max_retries=0).judge([("q", "a")])
    assert result.error == "echoed rubric"


def test_authors_format_through_the_judge() -> None:
    reply = "Correct but thin.\n[[6]]\n[[[It never gives the year, 1789.]]]"
    [result] = _judge(ScriptedBackend([reply]), prompt="authors").judge([("q", "a")])
    assert result.parse_ok and result.rating == 6
    assert result.critique == "It never gives the year, 1789."


class PrefillBackend(Backend):
    """A backend that prefills the assistant turn, as every local backend does: it records each
    call's prefills and stop strings and replies from a script per call (a list per item)."""

    name = "prefill-scripted"
    supports_prefill = True

    def __init__(self, steps: list[list[str]]) -> None:
        self.steps = list(steps)
        self.calls: list[tuple[list, tuple[str, ...], int]] = []

    def generate(self, conversations, params, *, n=1, seed=0, prefill=None):
        prefills = prefill if isinstance(prefill, list) else [prefill] * len(conversations)
        self.calls.append((prefills, params.stop, params.max_new_tokens))
        replies = self.steps.pop(0)
        return [[Completion(text, 10, 5)] for text in replies]


def test_authors_format_in_three_prefilled_steps() -> None:
    """Explanation up to "[[", the rating up to "]]", the critique up to "]]]": what each step
    is handed, and what the whole parses to. The second item's replies run on past the stop
    strings (a backend that does not cut at them): the rating step is cut at its first "]"."""
    backend = PrefillBackend([
        ["Correct but thin.\n", "Fine. [[ignored"],
        ["6", "9]] and more"],
        ["It never gives the year, 1789.", "Nothing.]]] trailing"],
    ])
    results = _judge(backend, prompt="authors", max_new_tokens=20, max_retries=0).judge(
        [("q1", "a1"), ("q2", "a2")])
    first = "Correct but thin.\n[["
    assert [call[0] for call in backend.calls] == [
        [None, None],
        [first, "Fine. [[ignored\n[["],
        [first + "6]]\n[[[", "Fine. [[ignored\n[[9]]\n[[["]]
    assert [call[1:] for call in backend.calls] == [(("[[",), 20), (("]]",), 4), (("]]]",), 20)]
    one, two = results
    assert one.raw == "Correct but thin.\n[[6]]\n[[[It never gives the year, 1789.]]]"
    assert (one.parse_ok, one.rating, one.critique) == (True, 6, "It never gives the year, 1789.")
    assert (one.prompt_tokens, one.completion_tokens, one.attempts) == (30, 15, 1)
    assert (two.rating, two.critique) == (9, "")  # "Nothing." is nothing missing


def test_only_failures_are_asked_again() -> None:
    backend = ScriptedBackend(["Missing: the date\nRating: 4", "nope", "Missing: a\nRating: 6"])
    results = _judge(backend, max_retries=1).judge([("q1", "a1"), ("q2", "a2")])
    assert [r.rating for r in results] == [4, 6]
    assert [r.attempts for r in results] == [1, 2]


def test_backend_failure_is_marked_as_such_not_a_score() -> None:
    backend = ScriptedBackend([], ok=False)
    [result] = _judge(backend, max_retries=1).judge([("q", "a")])
    assert not result.parse_ok and result.rating is None
    assert result.backend_failed and result.attempts == 1
    assert backend.seen_temperatures == [0.0]  # not re-asked as if it were a parse failure
    assert "backend failed" in result.error and "500" in result.error
    [parsed] = _judge(ScriptedBackend(["nope"]), max_retries=0).judge([("q", "a")])
    assert not parsed.parse_ok and not parsed.backend_failed


def test_numeric_mode_needs_no_critique() -> None:
    [result] = _judge(ScriptedBackend(["Rating: 8"]), mode="numeric").judge([("q", "a")])
    assert result.parse_ok and result.rating == 8 and result.critique is None


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def bundled(request) -> TransformersBackend:
    """The bundled model in each dtype, pinned (the guided format must hold in both)."""
    return TransformersBackend.load("bundled:smollm2-135m-instruct", batch_size=4,
                                    dtype=request.param)


@pytest.mark.slow
def test_guided_format_on_the_bundled_model(bundled: TransformersBackend, monkeypatch) -> None:
    reference = bundled.reference_view()
    calls = []
    real = reference.generate

    def generate(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(reference, "generate", generate)
    judge = BackendJudge(reference, role="fixed", model_name="bundled",
                         criteria="accuracy", max_new_tokens=24, max_retries=0)
    items = [("Why is the sky blue?", "Because of the sun."),
             ("What is 2 + 2?", "4, because two and two make four.")]
    results = judge.judge(items, seed=3)
    assert len(calls) == 1  # critique and rating in one generate call
    for r, [completion] in zip(results, calls[0], strict=True):
        # The guide forces the labels; the value after "Rating:" is the model's own, and the
        # parser must find a valid 1-10 integer there on the first, greedy attempt.
        assert r.rating is not None and 1 <= r.rating <= 10, r.raw
        # The judgement's text and token counts are the backend's completion's (tests/wim/
        # test_prefix_cache.py checks the backend's count on a model whose tokens are known).
        assert r.raw == "Missing:" + completion.text
        assert (r.prompt_tokens, r.completion_tokens) == (completion.prompt_tokens,
                                                          completion.completion_tokens)
        assert completion.completion_tokens > 0


@pytest.mark.slow
def test_fixed_judge_disables_a_peft_model_adapter(bundled: TransformersBackend) -> None:
    from peft import LoraConfig, get_peft_model

    from wim.backends import SamplingParams

    conv = [[{"role": "user", "content": "Name a colour."}]]
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    base = bundled.generate(conv, params)[0][0].text  # before LoRA layers go into the model
    model = get_peft_model(bundled.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                     init_lora_weights=False))
    try:
        policy = TransformersBackend(model, bundled.tokenizer, batch_size=2)
        with_adapter = policy.generate(conv, params)[0][0].text
        reference = policy.reference_view().generate(conv, params)[0][0].text
        assert reference == base  # the same weights with the adapter off: the frozen reference
        assert with_adapter != base  # a random, non-zero adapter changes the policy
    finally:
        model.unload()


def test_judge_input_longer_than_the_context_is_cut_or_skipped() -> None:
    backend = ScriptedBackend([])
    backend.context_tokens = 600  # the base estimate: 1 token per 3 characters
    judge = _judge(backend, max_new_tokens=48)
    long_prompt = "start " + "word " * 2000 + "the question?"
    items = [("short?", "an answer"), (long_prompt, "an answer")]
    (short, short_cut), (fitted, cut) = judge.fit(items, "truncate")
    assert short == items[0] and not short_cut
    assert cut and fitted[1] == "an answer"  # the response is never cut
    assert fitted[0].startswith("start") and fitted[0].endswith("the question?")
    assert backend.count_tokens(judge._messages(*fitted), "Missing:") <= 600 - 48 - 8
    assert judge.fit(items, "skip")[1] == (None, False)
    assert judge.fit(items, "truncate", max_input_tokens=100000)[1][1]  # context still binds
    backend.context_tokens = None
    assert judge.fit(items, "truncate") == [(item, False) for item in items]
