"""The guided judge format over HTTP: `response_format` with the judge's JSON schema, and the
fall back to plain text where a server refuses it.

The fault (a server that refuses the format) is simulated by a small real HTTP server on
127.0.0.1; the effect on a real judge is measured against a real llama-cpp-python server with
the bundled model (`server_url`, tests/conftest.py) through the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import QUICKSTART, SHRUNK, run_wim, sets
from recording_server import JSONServer, chat_completion

from wim.backends.http_backend import HTTPBackend
from wim.judge_prompts import JSON_OVERHEAD_TOKENS, judge_json_schema
from wim.judges import BackendJudge
from wim.records import read_records

ITEMS = [("What is 2 + 2?", "4."), ("Name a primary colour.", "Red."),
         ("What do bees make?", "Honey.")]


class FormatServer(JSONServer):
    """Chat completions that refuse some `response_format` types with `status` and a body
    naming the field; JSON when a schema is accepted, the two-line text format otherwise."""

    def __init__(self, refuse: tuple[str, ...], status: int = 400,
                 message: str = "response_format type {} is not supported") -> None:
        self.refuse, self.status, self.message = refuse, status, message
        self.seen: list[str | None] = []  # the response_format type of each request
        super().__init__()

    def respond(self, path: str, body: dict) -> tuple[int, dict]:
        fmt = body.get("response_format")
        kind = fmt["type"] if fmt else None
        with self.lock:
            self.seen.append(kind)
        if kind in self.refuse:
            return self.status, {"error": {"message": self.message.format(kind)}}
        wim = not fmt or "missing" in json.dumps(fmt)
        text = ('{"missing": "the unit", "rating": 6}' if kind and wim
                else '{"rating": 6}' if kind
                else "Missing: the unit\nRating: 6")
        return 200, chat_completion(text, 9, 9)


def _judge(server: FormatServer, guided: bool = True, mode: str = "wim"
           ) -> tuple[BackendJudge, HTTPBackend]:
    backend = HTTPBackend([server.url], "m", concurrency=1, max_retries=2, backoff_s=0.0)
    judge = BackendJudge(backend, role="external", model_name="m", max_retries=0,
                         guided_json=guided, mode=mode)
    return judge, backend


# The schemas of wim/judge_prompts.py (`judge_json_schema`, `critique_max_chars`) that
# wim/backends/http_backend.py sends as `response_format`, written out here rather than built by
# the code under test: an integer rating out of an enum of 1..10, and in wim mode a critique
# string of at most 2 characters per token of the judge's budget left after 24 tokens of JSON
# around it.
RATING = {"type": "integer", "enum": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}


def expected_schema(mode: str, max_new_tokens: int) -> dict:
    if mode == "numeric":
        return {"type": "object", "properties": {"rating": RATING}, "required": ["rating"],
                "additionalProperties": False}
    return {"type": "object",
            "properties": {"missing": {"type": "string", "maxLength": 2 * (max_new_tokens - 24)},
                           "rating": RATING},
            "required": ["missing", "rating"], "additionalProperties": False}


@pytest.mark.parametrize("mode", ["wim", "numeric"])
def test_the_exact_schema_is_sent_in_both_forms(mode):
    server = FormatServer(refuse=("json_schema",))
    try:
        judge, _ = _judge(server, mode=mode)
        results = judge.judge(ITEMS)
    finally:
        server.close()
    schema = expected_schema(mode, judge.max_new_tokens)
    first, *rest = server.bodies
    assert first["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "wim_judgement", "schema": schema, "strict": True}}
    assert len(rest) == len(ITEMS)
    for body in rest:
        assert body["response_format"] == {"type": "json_object", "schema": schema}
    # The rest of each request: the judge's greedy first attempt, its own token limit, the
    # instructions and the item (the format is asked for, not prefilled).
    for body, (prompt, response) in zip(rest, ITEMS, strict=True):
        assert body["model"] == "m" and body["temperature"] == 0.0
        # Room for a critique of maxLength characters at one token each, then the rating.
        max_length = schema["properties"]["missing"]["maxLength"] if mode == "wim" else 0
        assert body["max_tokens"] == max(judge.max_new_tokens,
                                         max_length + JSON_OVERHEAD_TOKENS if max_length else 0)
        assert mode != "wim" or body["max_tokens"] > judge.max_new_tokens
        text = json.dumps(body["messages"])
        assert json.dumps(prompt)[1:-1] in text and json.dumps(response)[1:-1] in text
        assert body["messages"][-1]["role"] == "user"
    assert all(r.parse_ok and r.rating == 6 for r in results)
    assert [r.critique for r in results] == (["the unit"] * 3 if mode == "wim" else [None] * 3)


@pytest.mark.parametrize("status", [400, 422, 500])
def test_refused_schema_falls_back_to_plain_text(status):
    server = FormatServer(refuse=("json_schema", "json_object"), status=status)
    try:
        judge, backend = _judge(server)
        results = judge.judge(ITEMS)
    finally:
        server.close()
    assert all(r.parse_ok and r.rating == 6 and r.critique == "the unit" for r in results)
    # Each form is tried once, then every request is plain text; no request failed or retried.
    assert server.seen == ["json_schema", "json_object", None, None, None]
    assert backend.stats["guided_refused"] == 2
    assert backend.stats["failures"] == backend.stats["retries"] == 0


def test_second_form_is_used_when_only_the_first_is_refused():
    server = FormatServer(refuse=("json_schema",))
    try:
        judge, backend = _judge(server)
        results = judge.judge(ITEMS)
    finally:
        server.close()
    assert server.seen == ["json_schema", "json_object", "json_object", "json_object"]
    assert all(r.parse_ok and r.raw.startswith("{") for r in results)
    assert backend.stats["guided_refused"] == 1


def test_accepted_schema_and_the_switch_off():
    server = FormatServer(refuse=())
    try:
        results = _judge(server)[0].judge(ITEMS)
        assert server.seen == ["json_schema"] * 3
        assert all(r.parse_ok and r.raw.startswith("{") for r in results)
        server.seen.clear()
        _judge(server, guided=False)[0].judge(ITEMS)
        assert server.seen == [None] * 3
    finally:
        server.close()


def test_a_server_error_that_does_not_name_the_format_is_no_refusal():
    server = FormatServer(refuse=("json_schema", "json_object"), status=503,
                          message="server overloaded")
    try:
        judge, backend = _judge(server)
        results = judge.judge(ITEMS[:1])
    finally:
        server.close()
    # An ordinary 5xx is retried (3 attempts, all with the schema), then a backend failure.
    assert server.seen == ["json_schema"] * 3
    assert results[0].backend_failed and backend.stats["guided_refused"] == 0


def test_schema_matches_the_parser():
    schema = judge_json_schema("wim")
    assert schema["required"] == ["missing", "rating"]
    assert judge_json_schema("numeric")["required"] == ["rating"]


def test_the_critique_is_bounded_by_the_token_budget():
    """maxLength leaves the rating room within judge.max_new_tokens: 2 characters a token,
    24 tokens for the JSON around the critique."""
    lengths = [judge_json_schema("wim", t)["properties"]["missing"]["maxLength"]
               for t in (64, 128, 30)]
    assert lengths == [80, 208, 12]
    assert judge_json_schema("wim")["properties"]["missing"]["maxLength"] == 300


@pytest.mark.slow
def test_guided_format_on_a_real_llama_cpp_server(server_url: str, tmp_path: Path) -> None:
    """The bundled judge over HTTP, as configs/http_judge.yaml sets it up (128 new tokens):
    plain text almost never parses; the guided format almost always does."""
    rates = {}
    for guided in (False, True):
        out = tmp_path / f"guided_{guided}"
        overrides = [*SHRUNK, "judge.role=external", "judge.backend=http",
                     f"http.base_urls=[{server_url}]", "http.model=smollm2",
                     "http.timeout_s=120", "judge.max_new_tokens=128", "judge.max_retries=0",
                     f"judge.guided_json={str(guided).lower()}"]
        run_wim(["run", str(QUICKSTART), "--out", str(out), "--skip-train", "--no-progress",
                 *sets(overrides)])
        judgements = read_records(out / "judgements.jsonl")
        report = json.loads((out / "report.json").read_text())
        assert len(judgements) == 8 and report["http/judge/failures"] == 0
        rates[guided] = sum(not j["parse_ok"] for j in judgements) / len(judgements)
        if guided:
            # llama-cpp-python's server refuses OpenAI's json_schema form (once per request
            # already in flight), then takes the json_object form with the schema: every
            # verdict is JSON.
            assert 1 <= report["http/judge/guided_refused"] <= 8
            assert all(j["raw_judge_text"].lstrip().startswith("{") for j in judgements)
    assert rates[False] >= 0.75, rates
    assert rates[True] <= 0.25, rates


@pytest.mark.parametrize(("text", "critique", "rating", "ok"), [
    ('{"missing": "the unit", "rating": 6}', "the unit", 6, True),
    ('```json\n{"missing": "None", "rating": 10}\n```', "", 10, True),
    ('{ "missing": "a\nraw newline" ,"rating" : 4} ', "a raw newline", 4, True),
    ('{"missing": "the unit", "rating": 1000000000000000}', "the unit", None, False),
    ('{"missing": "the unit", "rating": 7.5}', "the unit", None, False),
    ('{"missing": null, "rating": 6}', None, 6, False),
    # An echoed rubric inside the JSON is still an echoed rubric.
    ('{"missing": "10 = nothing important missing, 7-9 = minor points", "rating": 8}',
     None, 8, False),
])
def test_parser_reads_the_json_form(text, critique, rating, ok):
    from wim.parsing import parse_judgement

    parsed = parse_judgement(text)
    assert (parsed.critique, parsed.rating, parsed.ok) == (critique, rating, ok)
