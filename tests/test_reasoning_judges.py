"""Reasoning judges as they really answer, through the real CLI (`wim generate` from a source
file, so no policy model loads, then `wim judge DIR`): a hosted reasoning API that refuses
`max_tokens`, `top_p`, `temperature` and `logprobs` and spends the budget thinking; open models
on vLLM with and without a reasoning parser. The stand-ins are in tests/reasoning_servers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICKSTART, run_wim, sets
from reasoning_servers import (
    HostedReasoningAPI,
    ParsedReasoningServer,
    ThinkingServer,
    verdict_for,
)

from wim.backends.http_fields import refused_field, shaped
from wim.config import ConfigError, load_config
from wim.records import read_keyed

NO_POLICY = "policy.model=/nonexistent/policy"  # loading it would fail: proves nothing samples
CONCURRENCY = 4


def _source(tmp_path: Path, prompts: int = 8) -> Path:
    source = tmp_path / "responses.jsonl"
    rows = [{"id": f"q{i}", "prompt": f"How do I do task {i} safely?",
             "responses": [f"Do step {i} carefully.", f"Just do {i}; it is fine."]}
            for i in range(prompts)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return source


def _judge(tmp_path: Path, url: str, *overrides: str, name: str = "run", check: bool = True):
    """`wim generate` from the source file, then `wim judge DIR` with an http judge at `url`."""
    out = tmp_path / name
    config = sets([f"generation.source={_source(tmp_path)}", NO_POLICY, "prompts.holdout=0",
                   "judge.role=external", "judge.backend=http", f"judge.http.base_urls=[{url}]",
                   "judge.http.model=reasoner", f"judge.http.concurrency={CONCURRENCY}",
                   "judge.http.max_retries=0", "judge.http.timeout_s=30", *overrides])
    run_wim(["generate", str(QUICKSTART), "--out", str(out), "--no-progress", *config])
    proc = run_wim(["judge", str(out), "--no-progress"], check=check)
    return out, proc


def _stats(out: Path) -> dict:
    return json.loads((out / "stats" / "judge.json").read_text())


def _check_verdicts(out: Path) -> list[dict]:
    """Every sample judged, each with the rating and critique the answer (not the thinking)
    gave."""
    samples, judgements = read_keyed(out / "samples.jsonl"), read_keyed(out / "judgements.jsonl")
    assert len(judgements) == len(samples) == 16
    for j in judgements:
        critique, rating = verdict_for(j["response"])
        assert (j["rating"], j["critique"], j["parse_ok"]) == (rating, critique, True), j
        assert "decoy" not in j["raw_judge_text"]
    return judgements


# --- the hosted reasoning API -----------------------------------------------------------------


def test_a_hosted_reasoning_api_judges_once_its_refusals_are_learned(tmp_path: Path) -> None:
    """Raise judge.max_new_tokens only: every judgement recorded with the answer's rating; each
    refused field refused at most once per request in flight, warned once, counted."""
    server = HostedReasoningAPI()
    try:
        out, proc = _judge(tmp_path, server.url, "judge.max_new_tokens=4096",
                           "judge.http.params={reasoning_effort: low, service_tier: flex}")
    finally:
        server.close()
    judgements = _check_verdicts(out)
    assert all(j["reasoning_tokens"] > 0 and "reasoning" not in j for j in judgements)
    stats = _stats(out)
    for field in ("max_tokens", "top_p", "temperature"):
        # Learned once: only the requests already in flight when it was first refused.
        assert 1 <= server.refused[field] <= CONCURRENCY, (field, server.refused)
        assert stats[f"http/judge/refused_{field}"] == server.refused[field]
        assert proc.stderr.count(f"the server refused '{field}'") == 1
    assert stats["http/judge/failures"] == 0 and stats["judge/backend_failed"] == 0
    assert stats["tokens/judge/reasoning"] == sum(j["reasoning_tokens"] for j in judgements)
    refused = sum(server.refused.values())
    assert len(server.bodies) == 16 + refused  # each judgement answered by one request
    assert all(b["reasoning_effort"] == "low" and b["service_tier"] == "flex"
               for b in server.bodies)


def test_the_shipped_reasoning_config_works(tmp_path: Path) -> None:
    """configs/reasoning_judge.yaml as it is, its URL pointed at the stand-in."""
    config = Path(__file__).resolve().parents[1] / "configs" / "reasoning_judge.yaml"
    server = HostedReasoningAPI()
    out = tmp_path / "run"
    try:
        run_wim(["generate", str(config), "--out", str(out), "--no-progress",
                 *sets([f"generation.source={_source(tmp_path)}", NO_POLICY, "generation.k=2",
                        "prompts.holdout=0", f"judge.http.base_urls=[{server.url}]"])])
        run_wim(["judge", str(out), "--no-progress"])
    finally:
        server.close()
    _check_verdicts(out)
    assert all(b["model"] == "o4-mini" and b["reasoning_effort"] == "low"
               for b in server.bodies)


def test_at_the_default_budget_the_run_names_the_setting(tmp_path: Path) -> None:
    """Reasoning spends judge.max_new_tokens: empty content, finish_reason length. Counted as
    budget_exhausted (not a server failure), nothing recorded, exit 3 naming the setting."""
    server = HostedReasoningAPI()
    try:
        out, proc = _judge(tmp_path, server.url, check=False)
    finally:
        server.close()
    assert proc.returncode == 3, proc.stderr[-2000:]
    message = proc.stderr.split("wim: incomplete:")[-1]
    assert "16 judgements ran out of tokens before any answer" in message
    # The quickstart's judge.max_new_tokens is 32 (the guided format adds room to it).
    assert "no answer within judge.max_new_tokens (32; 40 completion tokens spent, 40 of " \
        "them reasoning)" in message
    assert "server down" not in message
    stats = _stats(out)
    assert stats["judge/budget_exhausted"] == 16 and stats["judge/backend_failed"] == 0
    assert stats["http/judge/failures"] == 0
    assert not read_keyed(out / "judgements.jsonl")
    # Not asked again at the same budget: one answered request per judgement.
    assert len(server.bodies) == 16 + sum(server.refused.values())


# --- open models on vLLM ----------------------------------------------------------------------


@pytest.mark.parametrize("r1_template", [False, True], ids=["think-tags", "r1-closing-only"])
def test_thinking_in_the_content_is_never_parsed(tmp_path: Path, r1_template: bool) -> None:
    """No reasoning parser: the text up to the last </think> (with or without <think>) holds a
    decoy "Rating: 10" and is kept as `reasoning`; the answer after it is what counts, plain
    or JSON."""
    server = ThinkingServer(r1_template=r1_template)
    try:
        out, _ = _judge(tmp_path, server.url, "judge.max_new_tokens=1024",
                        "judge.guided_json=false")
    finally:
        server.close()
    judgements = _check_verdicts(out)
    assert all("decoy thought" in j["reasoning"] and "<think>" not in j["reasoning"]
               and "</think>" not in j["reasoning"] for j in judgements)
    assert any(j["raw_judge_text"].startswith("{") for j in judgements)  # JSON answers too
    assert _stats(out)["judge/parse_failed"] == 0


def test_keep_reasoning_false_drops_it(tmp_path: Path) -> None:
    server = ThinkingServer()
    try:
        out, _ = _judge(tmp_path, server.url, "judge.max_new_tokens=1024",
                        "judge.guided_json=false", "judge.keep_reasoning=false")
    finally:
        server.close()
    assert not any("reasoning" in j for j in _check_verdicts(out))


def test_a_reply_cut_inside_its_think_block_is_budget_exhausted(tmp_path: Path) -> None:
    """Cut by the budget before </think>: the decoy inside is not read as a rating."""
    server = ThinkingServer()
    try:
        out, proc = _judge(tmp_path, server.url, "judge.guided_json=false", check=False)
    finally:
        server.close()
    assert proc.returncode == 3 and "judge.max_new_tokens" in proc.stderr
    assert _stats(out)["judge/budget_exhausted"] == 16
    assert not read_keyed(out / "judgements.jsonl")


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_a_reasoning_parser_field_is_kept_apart(tmp_path: Path, field: str) -> None:
    server = ParsedReasoningServer(field)
    try:
        out, _ = _judge(tmp_path, server.url, "judge.max_new_tokens=1024")
        cut, proc = _judge(tmp_path, server.url, name="cut", check=False)
    finally:
        server.close()
    judgements = _check_verdicts(out)
    assert all(j["raw_judge_text"].startswith("{") and "decoy thought" in j["reasoning"]
               for j in judgements)
    # At the default budget `content` is null: counted as budget_exhausted, not malformed.
    assert proc.returncode == 3 and "judge.max_new_tokens" in proc.stderr
    stats = _stats(cut)
    assert stats["judge/budget_exhausted"] == 16 and stats["http/judge/retries"] == 0


# --- what is learned from a 4xx, and what is not -----------------------------------------------


def _body(message: str, param: str | None = None, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": param, "code": code}}).encode()


@pytest.mark.parametrize(("status", "body", "field"), [
    (400, _body("Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                "'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter"),
     "max_tokens"),
    (400, _body("Unsupported value: 'temperature' does not support 0 with this model. Only "
                "the default (1) value is supported.", "temperature", "unsupported_value"),
     "temperature"),
    (400, _body("'temperature' is not supported with this model."), "temperature"),
    (400, _body("Unsupported parameter: 'top_logprobs' is not supported with this model.",
                "top_logprobs"), "logprobs"),
    (403, _body("You are not allowed to request logprobs from this model"), "logprobs"),
    (400, b'{"detail": "Unsupported parameter: top_p"}', "top_p"),
    # Not refusals of a field: nothing is learned, the request fails as before.
    (400, _body("'max_tokens' or 'max_completion_tokens' is too large: 64. This model's "
                "maximum context length is 2048 tokens and your request has 2000 input tokens"),
     None),
    (400, _body("This model's maximum context length is 4096 tokens. However, you requested "
                "5000 tokens.", "messages"), None),
    (404, _body("The model 'x' does not exist or is not supported"), None),
    (429, _body("Rate limit reached for requests; logprobs not allowed"), None),
    (500, _body("Unsupported parameter: 'max_tokens'"), None),
])
def test_refused_field(status: int, body: bytes, field: str | None) -> None:
    assert refused_field(status, body) == field


def test_shaped_payloads() -> None:
    payload = {"model": "m", "max_tokens": 9, "temperature": 0.0, "top_p": 1.0, "logprobs": True,
               "top_logprobs": 8, "seed": 3}
    assert shaped(payload, set()) == payload
    assert shaped(payload, {"max_tokens", "temperature", "top_p", "logprobs"}) == {
        "model": "m", "max_completion_tokens": 9, "seed": 3}
    assert payload["max_tokens"] == 9  # the caller's payload is left as it was


@pytest.mark.parametrize("key", ["http.params", "judge.http.params", "blind.http.params"])
def test_params_may_not_name_a_field_wim_sets(key: str) -> None:
    external = ["judge.role=external", "judge.backend=http", "http.base_urls=[http://x/v1]"]
    with pytest.raises(ConfigError, match=rf"'{key}' must name only request fields wim does "
                                          r"not set itself .* but it names max_tokens, seed"):
        load_config(QUICKSTART, [*external,
                                 f"{key}={{max_tokens: 5, seed: 1, reasoning_effort: low}}"])
    cfg = load_config(QUICKSTART, [*external,
                                   f"{key}={{chat_template_kwargs: {{enable_thinking: false}}}}"])
    assert cfg.http.params or cfg.judge.http.params or cfg.blind.http.params


# --- the blind evaluator ----------------------------------------------------------------------


def _blind_eval(url: str, *overrides: str):
    """The eval of `wim eval` on fixed answers: the evaluator opened from the config as the
    command opens it, both orders asked, eval.json's document and what the command prints."""
    import contextlib
    import io

    from training.evaluate import System, blind_comparisons, eval_markdown, eval_report
    from wim.blind import open_blind_evaluator
    from wim.cli.evaluation import _print_eval
    from wim.prompts import Prompt

    cfg = load_config(QUICKSTART, ["blind.backend=http", f"blind.http.base_urls=[{url}]",
                                   "blind.http.model=reasoner", "blind.http.max_retries=0",
                                   f"blind.http.concurrency={CONCURRENCY}", *overrides])
    prompts = [Prompt(f"h{i}", "", ({"role": "user", "content": f"Question {i}?"},))
               for i in range(6)]
    answers = {"policy": [{"response": f"A careful answer {i}."} for i in range(6)],
               "base": [{"response": f"Answer {i}."} for i in range(6)]}
    pairs = [("policy vs base", "policy", "base")]
    evaluator = open_blind_evaluator(cfg)
    try:
        outcomes, records = blind_comparisons(evaluator, "pairwise", prompts, answers, pairs)
    finally:
        evaluator.close()
    report = eval_report(cfg, evaluator, outcomes, pairs,
                         [System("policy", "m"), System("base", "m")], records, len(prompts))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = _print_eval(report, Path("eval.json"))
    return report, records, eval_markdown(report), printed.getvalue(), code


@pytest.mark.parametrize("logprobs_403", [False, True], ids=["400", "403"])
def test_a_hosted_reasoning_api_as_blind_evaluator_gives_hard_verdicts(logprobs_403: bool):
    """It refuses logprobs: every verdict is hard, in both orders, marked as such, and no
    probability is made up."""
    server = HostedReasoningAPI(logprobs_403=logprobs_403)
    try:
        report, records, md, printed, code = _blind_eval(server.url, "blind.max_new_tokens=4096")
    finally:
        server.close()
    assert code == 0 and 1 <= server.refused["logprobs"] <= CONCURRENCY
    assert report["evaluator"]["verdict"] == "hard"
    assert report["evaluator"]["verdict_note"] == ("hard verdicts: the evaluator gives no token "
                                                   "probabilities")
    assert "hard verdicts: the evaluator gives no token probabilities" in printed
    assert "hard verdicts: the evaluator gives no token probabilities" in md
    assert report["hard_fallback"] == 0 and report["comparisons"][0]["failures"] == 0
    for r in records:
        assert r["winner"] and r["order_ab"] and r["order_ba"]  # both orders asked
        assert r["probs_ab"] is None and r["probs_ba"] is None
        assert r["preference_source"] == "hard" and r["preference"] in (0.0, 0.5, 1.0)
    # Requests built before the refusal was learned may reach the server after later ones
    # (threads), so the check is on what it answered, not on the last bodies it received.
    assert len(server.answered) == len(records) * 2
    assert all("logprobs" not in b and "top_logprobs" not in b for b in server.answered)


def test_a_reasoning_blind_evaluator_at_the_default_budget_names_the_setting():
    server = HostedReasoningAPI()
    try:
        report, records, _, printed, code = _blind_eval(server.url)
    finally:
        server.close()
    assert code == 3 and report["budget_exhausted"] == 6 and report["backend_failures"] == 0
    assert "Raise blind.max_new_tokens" in printed
    assert all("no answer within blind.max_new_tokens (48;" in r["failure"] for r in records)


def test_the_embedder_sends_its_own_params_only() -> None:
    """`http.params` are the chat servers' (reasoning_effort would be refused by /embeddings):
    the embeddings server gets `scoring.http.params` alone."""
    from recording_server import JSONServer

    from wim.embedders import open_embedder

    class Embeddings(JSONServer):
        def respond(self, path: str, body: dict):
            return 200, {"data": [{"index": i, "embedding": [1.0, float(i)]}
                                  for i in range(len(body["input"]))]}

    server = Embeddings()
    try:
        cfg = load_config(QUICKSTART, [
            "scoring.backend=http", f"http.base_urls=[{server.url}]", "scoring.http.model=e",
            "http.params={reasoning_effort: low}", "scoring.http.params={dimensions: 2}"])
        embedder = open_embedder(cfg)
        assert embedder.embed(["a", "b"]).shape == (2, 2)
    finally:
        server.close()
    assert server.bodies == [{"dimensions": 2, "model": "e", "input": ["a", "b"],
                              "encoding_format": "float"}]
