"""Stand-ins for reasoning judges as they really answer (facts: /work/shared/DESIGN.md, "Reasoning
judges"; OpenAI's o-series bodies as users report them, e.g. aandrew-me/tgpt#333).

- `HostedReasoningAPI`: a hosted reasoning model. It answers 400 with OpenAI's exact bodies to
  `max_tokens`, to `top_p`, to any `temperature` but 1, and to `logprobs` / `top_logprobs` (or a
  403 "not allowed to request logprobs", as some providers do); it checks one field at a time,
  in that order, as OpenAI does. Its hidden reasoning spends `max_completion_tokens`: when it
  uses them up, the content is empty with `finish_reason: "length"`; `usage` counts
  `completion_tokens_details.reasoning_tokens`. Replies take a varied time.
- `ThinkingServer`: an open model on vLLM without a reasoning parser: the thinking is in the
  content before `</think>`, with the opening `<think>` or (R1-style templates) without it, and
  holds a decoy "Rating: 10". Cut by `max_tokens`, the content ends inside the thinking.
- `ParsedReasoningServer`: the same model with vLLM's reasoning parser: the thinking in
  `reasoning` (or the old `reasoning_content`), `content` null when cut inside it.

Each decides the answer from the judged response alone (`verdict_for`), so a test knows the
rating every judgement must record.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time

from recording_server import JSONServer

_UNSUPPORTED = {
    "max_tokens": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                  "'max_completion_tokens' instead.",
    "top_p": "Unsupported parameter: 'top_p' is not supported with this model.",
    "logprobs": "Unsupported parameter: 'logprobs' is not supported with this model.",
    "top_logprobs": "Unsupported parameter: 'top_logprobs' is not supported with this model.",
}
DECOY = "Missing: a decoy thought\nRating: 10"


def judged_response(body: dict) -> str:
    """The response under judgement, from wim's judge prompt (the last user turn)."""
    text = body["messages"][-1]["content"]
    return text.split("\nAnswer:\n", 1)[-1].strip()


def verdict_for(response: str) -> tuple[str, int]:
    """(critique, rating) the stand-ins give a response: fixed by its text."""
    digest = int(hashlib.sha256(response.encode()).hexdigest(), 16)
    return f"the caveat numbered {digest % 97}", 1 + digest % 9


def _reasoning_words(body: dict) -> int:
    """How long the model thinks about this request: 150 to 450 tokens, fixed by the text."""
    digest = hashlib.sha256(json.dumps(body["messages"]).encode()).digest()
    return 150 + digest[0] + digest[1] % 45


def _answer(body: dict, as_json: bool) -> str:
    if "Answer A:" in body["messages"][-1]["content"]:  # the blind evaluator
        verdict = "A" if len(body["messages"][-1]["content"]) % 2 else "B"
        return (json.dumps({"reason": "clearer", "verdict": verdict}) if as_json
                else f"Reason: clearer.\nVerdict: {verdict}")
    critique, rating = verdict_for(judged_response(body))
    return (json.dumps({"missing": critique, "rating": rating}) if as_json
            else f"Missing: {critique}\nRating: {rating}")


class _Counting(JSONServer):
    """A JSONServer that counts the requests in flight and sleeps a varied time (5-40 ms)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self._count = threading.Lock()
        self._jitter = random.Random(0)
        super().__init__()

    def respond(self, path: str, body: dict):
        with self._count:
            self.in_flight += 1
            pause = self._jitter.uniform(0.005, 0.04)
        try:
            time.sleep(pause)
            return self.answer(body)
        finally:
            with self._count:
                self.in_flight -= 1

    def answer(self, body: dict):
        raise NotImplementedError


class HostedReasoningAPI(_Counting):
    """A hosted reasoning model (see the module docstring). `refused[field]`: requests refused
    for it; `in_flight_at_first[field]`: requests in flight when it was first refused;
    `answered`: the bodies it answered 200, in the order it answered them."""

    def __init__(self, logprobs_403: bool = False) -> None:
        self.logprobs_403 = logprobs_403
        self.refused: dict[str, int] = {}
        self.in_flight_at_first: dict[str, int] = {}
        self.answered: list[dict] = []
        super().__init__()

    def _refuse(self, field: str, status: int, message: str, code: str) -> tuple[int, dict]:
        with self._count:
            self.refused[field] = self.refused.get(field, 0) + 1
            self.in_flight_at_first.setdefault(field, self.in_flight)
        if status == 403:
            return 403, {"error": {"message": message, "type": "invalid_request_error",
                                   "param": None, "code": None}}
        return 400, {"error": {"message": message, "type": "invalid_request_error",
                               "param": field, "code": code}}

    def answer(self, body: dict):
        for field in ("max_tokens", "top_p"):
            if field in body:
                return self._refuse(field, 400, _UNSUPPORTED[field], "unsupported_parameter")
        if "temperature" in body and body["temperature"] != 1:
            return self._refuse(
                "temperature", 400, f"Unsupported value: 'temperature' does not support "
                f"{body['temperature']} with this model. Only the default (1) value is "
                "supported.", "unsupported_value")
        for field in ("logprobs", "top_logprobs"):
            if field in body:
                if self.logprobs_403:
                    return self._refuse("logprobs", 403, "You are not allowed to request "
                                        "logprobs from this model", "")
                return self._refuse(field, 400, _UNSUPPORTED[field], "unsupported_parameter")
        budget = body.get("max_completion_tokens", 4096)
        thinking = _reasoning_words(body)
        text = _answer(body, "response_format" in body)
        if thinking >= budget:  # the reasoning spent it all: empty content
            content, finish, spent = "", "length", budget
            thinking = budget
        else:
            content, finish, spent = text, "stop", thinking + len(text) // 4
        with self._count:
            self.answered.append(body)
        return 200, {
            "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": spent,
                      "completion_tokens_details": {"reasoning_tokens": thinking}}}


def _thinking(body: dict) -> list[str]:
    """The thinking as words, the decoy verdict inside it."""
    words = ("Let me weigh the response first. " * 60).split()
    n = _reasoning_words(body)
    return words[: n // 2] + DECOY.split(" ") + words[: n - n // 2]


class ThinkingServer(_Counting):
    """vLLM without a reasoning parser: the thinking in the content, closed by `</think>`,
    opened by `<think>` unless `r1_template` (the template put it in the prompt). The answer
    is JSON on every other response (a model asked for a format may write JSON anyway)."""

    def __init__(self, r1_template: bool = False) -> None:
        self.r1_template = r1_template
        super().__init__()

    def answer(self, body: dict):
        words = _thinking(body)
        budget = body.get("max_tokens") or 10**6
        opening = "" if self.r1_template else "<think>\n"
        as_json = verdict_for(judged_response(body))[1] % 2 == 0
        if len(words) >= budget:  # cut inside the thinking
            content, finish, spent = opening + " ".join(words[:budget]), "length", budget
        else:
            content = opening + " ".join(words) + "\n</think>\n\n" + _answer(body, as_json)
            finish, spent = "stop", len(words) + 20
        return 200, {"choices": [{"index": 0, "finish_reason": finish,
                                  "message": {"role": "assistant", "content": content}}],
                     "usage": {"prompt_tokens": 100, "completion_tokens": spent}}


class ParsedReasoningServer(_Counting):
    """vLLM with a reasoning parser: the thinking in `field` (`reasoning`, or the old
    `reasoning_content`), the answer (guided JSON applies after the thinking) in `content`,
    which is null when the budget ends inside the thinking."""

    def __init__(self, field: str = "reasoning") -> None:
        self.field = field
        super().__init__()

    def answer(self, body: dict):
        words = _thinking(body)
        budget = body.get("max_tokens") or 10**6
        if len(words) >= budget:
            message = {"role": "assistant", "content": None,
                       self.field: " ".join(words[:budget])}
            finish, spent = "length", budget
        else:
            message = {"role": "assistant", "content": _answer(body, "response_format" in body),
                       self.field: " ".join(words)}
            finish, spent = "stop", len(words) + 20
        return 200, {"choices": [{"index": 0, "finish_reason": finish, "message": message}],
                     "usage": {"prompt_tokens": 100, "completion_tokens": spent}}
