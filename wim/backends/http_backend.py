"""Generation over HTTP from OpenAI-compatible servers (vLLM, SGLang, TGI, llama.cpp, OpenAI).

The transport is wim/backends/http_client.py (one per backend): its in-flight cap is shared
by every `generate` call from any thread (the stages run several batches at once,
data_gen/flow.py); retries, failover, rate limits and the per-URL counts are the client's.

Samples of one prompt come from one request with `n=k` (vLLM, SGLang and OpenAI take it; the
server then reads the prompt once). A server that refuses `n` (a 4xx naming it) or answers
with fewer choices gets the missing samples as single requests (`n=1`) from then on, counted
(`stats["n_fallback"]`). A failed request becomes `Completion(ok=False, error=...)`: the
backend never raises for a request and never waits without a timeout.

Guided judge format (`SamplingParams.json_schema`): a `response_format` in OpenAI's form
(`{"type": "json_schema", ...}`: vLLM, SGLang, OpenAI, llama.cpp's llama-server), once refused
the `{"type": "json_object", "schema": ...}` form (llama-cpp-python's server, llama-server),
then none (plain text). A refusal is a 4xx whose body names the format, or a 5xx that names
`response_format` (llama-cpp-python answers an unknown format type with a 500); it is
remembered for the backend's lifetime, counted (`stats["guided_refused"]`), and not a retry.

Refused request fields (`max_tokens`, `temperature`, `top_p`, `logprobs`): see
wim/backends/http_fields.py and docs/design.md, "Judging". A reply's `reasoning` (or
`reasoning_content`) field becomes `Completion.reasoning`, its `finish_reason` and
`reasoning_tokens` are kept, and a null `content` is an empty text where the server says the
reply was cut (`finish_reason: "length"`) or gave reasoning; otherwise it is malformed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re

from wim.backends.base import Backend, Completion, Conversation, SamplingParams, Usage, sample_seed
from wim.backends.http_client import Failure, HTTPClient, http_failure, malformed
from wim.backends.http_fields import refused_field, sent, shaped

logger = logging.getLogger(__name__)

_N_REFUSED = "the server refused n > 1"
_NOT_SENT = Completion("", ok=False, error=_N_REFUSED)  # n > 1 not sent: refused meanwhile
# A refusal of n names the field: "'n' must be 1", "n must be 1", "unsupported parameter: n".
_NAMES_N = re.compile(r"""['"`]n['"`]|\bn (?:must|should|is|>|<|=)|\bn\s*[:=]|parameter:? n\b""")

# The forms of `response_format` tried in order (the module docstring, "Guided judge format").
GUIDED_FORMS = ("json_schema", "json_object")
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "schema", "grammar")


class HTTPBackend(Backend):
    """Chat completions from OpenAI-compatible base URLs (`/v1`); `params`: extra fields of every
    request (`http.params`); `settings`: HTTPClient's."""

    name = "http"
    supports_prefill = False
    supports_json_schema = True

    def __init__(
        self, base_urls: list[str], model: str, context_tokens: int | None = None,
        params: dict | None = None, **settings
    ) -> None:
        client = self._client = HTTPClient(base_urls, **settings)
        self.base_urls = client.base_urls
        self.model = model
        self.params = dict(params or {})  # `http.params`: extra fields of every request
        # Kept for the repr: judge.batch swaps `_client` for a stand-in.
        self.api_key_env, self.concurrency = client.api_key_env, client.concurrency
        self.timeout_s, self.max_retries = client.timeout_s, client.max_retries
        # Under auto, enough work is queued for the most it may reach.
        cap = client.concurrency
        self.max_in_flight = client.max_concurrency if cap == "auto" else cap
        self.context_tokens = context_tokens  # prompts are measured with the base estimate
        self.stats = self._client.stats  # one dict: the client's counts and the two below
        self.stats.update({"guided_refused": 0, "n_fallback": 0})
        # Touched only on the client's loop thread, so no lock.
        self._refused: set[str] = set()  # response_format forms this server refused
        self._single = False  # the server refused n > 1: one request per sample from now on
        self._learned: set[str] = set()  # request fields it refused (wim/backends/http_fields)

    @property
    def gives_logprobs(self) -> bool:
        """False once the server has refused `logprobs`: no token probabilities from it."""
        return "logprobs" not in self._learned

    def __repr__(self) -> str:
        key = "set" if self._client._secret else "unset"
        return (
            f"HTTPBackend(base_urls={self.base_urls!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r} ({key}), concurrency={self.concurrency}, "
            f"timeout_s={self.timeout_s}, max_retries={self.max_retries})"
        )

    def generate(self, conversations: list[Conversation], params: SamplingParams, *, n: int = 1,
                 seed: int = 0, prefill: str | None = None) -> list[list[Completion]]:
        if prefill:
            raise ValueError("the http backend cannot prefill the assistant turn")
        return self._client.run(self._client.gather(
            [self._samples(conv, params, n, seed, i) for i, conv in enumerate(conversations)]))

    async def _samples(self, conv: Conversation, params: SamplingParams, n: int, seed: int,
                       index: int) -> list[Completion]:
        """The n samples of one conversation: one request with n, where the server takes it;
        the samples it did not give come as single requests with their own seeds."""
        got: list[Completion] = []
        if n > 1 and not self._single:
            got = await self._complete(conv, params, sample_seed(seed, index, 0), n=n)
            if got[0].ok and len(got) >= n:
                return got[:n]
            if not got[0].ok and got[0].error != _N_REFUSED:
                return [got[0]] * n  # a failed request fails its n samples
            if got[0] is not _NOT_SENT:  # refused or fell short: single requests from now on
                if not self._single:
                    logger.warning("the server gave %d of n=%d samples in one request; asking "
                                   "once per sample from now on", len(got) if got[0].ok else 0, n)
                self._single = True
                self.stats["n_fallback"] += 1
            if not got[0].ok:
                got = []
        singles = [self._complete(conv, params, sample_seed(seed, index, j))
                   for j in range(len(got), n)]
        return got + [c[0] for c in await asyncio.gather(*singles)]

    async def _complete(self, messages: Conversation, params: SamplingParams, seed: int,
                        n: int = 1) -> list[Completion]:
        """The choices of one chat-completion request (up to `n`), with retries; a failure is
        one `ok=False` completion (error `_N_REFUSED` when the server refused n > 1)."""
        payload: dict = {
            **self.params,
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": seed,
            "n": n,
        }
        if params.stop:
            payload["stop"] = list(params.stop)
        if params.top_logprobs:
            payload["logprobs"] = True
            payload["top_logprobs"] = params.top_logprobs
        form: list[str | None] = [None]  # the response_format form of the attempt in flight
        attempt: list[dict] = [payload]  # the payload of the attempt in flight, as sent

        def prepare() -> dict | None:
            if n > 1 and self._single:  # refused while this request waited for a slot
                return None
            form[0] = self._guided_form(payload, params.json_schema)
            attempt[0] = shaped(payload, self._learned)  # what the server refused meanwhile
            return attempt[0]

        def parse(status: int, body: bytes, url: str) -> list[Completion] | str | Failure:
            if status == 200:
                return _parse(body, url)
            field = refused_field(status, body)
            if field is not None and sent(attempt[0], field):
                # Sent again at once without it (not an attempt); `sent` ends the repeats.
                reason = http_failure(status, body, url).reason
                self._learn(field, reason)
                return Failure(reason, repeat=True)
            text = body[:4000].decode("utf-8", errors="replace").lower()
            if n > 1 and 400 <= status < 500 and status != 429 and _NAMES_N.search(text):
                return _N_REFUSED
            # llama-cpp-python's server answers a request it cannot validate with a 500 that
            # names the field; a 5xx that does not name it is an ordinary server error.
            refused = ((400 <= status < 500 and status != 429
                        and any(w in text for w in _FORMAT_WORDS))
                       or (status >= 500 and "response_format" in text))
            failure = http_failure(status, body, url)
            if refused and form[0] is not None:
                self._refuse(form[0], failure.reason)
                return Failure(failure.reason, repeat=True)
            return failure

        outcome = await self._client.request("/chat/completions", prepare, parse)
        if outcome is None:  # the server refused n > 1 to another request meanwhile
            return [_NOT_SENT]
        if outcome == _N_REFUSED:
            return [Completion("", ok=False, error=_N_REFUSED)]
        if isinstance(outcome, Failure):
            return [Completion("", ok=False, error=outcome.reason)]
        return outcome

    def _guided_form(self, payload: dict, schema: dict | None) -> str | None:
        """Set `payload["response_format"]` to the first form not refused; the form or None."""
        payload.pop("response_format", None)
        if schema is None:
            return None
        form = next((f for f in GUIDED_FORMS if f not in self._refused), None)
        if form == "json_schema":
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "wim_judgement", "schema": schema, "strict": True},
            }
        elif form == "json_object":
            payload["response_format"] = {"type": "json_object", "schema": schema}
        return form

    def _learn(self, field: str, reason: str) -> None:
        """Count a refusal of `field`; the first one is learned, with one warning line."""
        key = f"refused_{field}"
        self.stats[key] = self.stats.get(key, 0) + 1  # present once a field was refused
        if field in self._learned:
            return
        self._learned.add(field)
        instead = {"max_tokens": "sending max_completion_tokens instead",
                   "temperature": "leaving it out (the server's default; retries then vary by "
                                  "seed alone)",
                   "top_p": "leaving it out (the server's default)",
                   "logprobs": "leaving logprobs and top_logprobs out (no token probabilities "
                               "from this server: verdicts are hard)"}[field]
        logger.warning("the server refused %r (%s); %s from now on", field,
                       self._client.scrub(reason), instead)

    def _refuse(self, form: str, reason: str) -> None:
        self.stats["guided_refused"] += 1
        if form not in self._refused:
            self._refused.add(form)
            after = next((f for f in GUIDED_FORMS if f not in self._refused), "plain text")
            logger.warning("the server refused response_format %r (%s); using %s instead",
                           form, self._client.scrub(reason), after)

    def close(self) -> None:
        self._client.close()


def read_usage(usage: dict | None) -> Usage:
    """A reply's `usage`: prompt and completion tokens, and the parts of them that OpenAI's
    shape details, `prompt_tokens_details.cached_tokens` and
    `completion_tokens_details.reasoning_tokens` (vLLM sends null details when it counts none).
    A count the server did not send is 0, never estimated."""
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                 int(cached or 0), int(reasoning or 0))


def _shares(total: int, weights: list[int]) -> list[int]:
    """`total` shared out by `weights`, the rounding remainder to the first, so the sum is exact."""
    shares = [total * w // sum(weights) for w in weights]
    shares[0] += total - sum(shares)
    return shares


def _parse(body: bytes, url: str) -> list[Completion] | Failure:
    """The choices of a chat-completion body, or a retryable failure if it is malformed. The
    prompt is read once, so its tokens (and the cached ones) go to the first choice; the
    completion and reasoning tokens (one total each in `usage`) are shared out by the choices'
    text lengths. A reasoning model's thinking (`reasoning`, or vLLM's old
    `reasoning_content`) is kept apart; its `content` may then be null (cut inside the
    reasoning): an empty text."""
    try:
        data = json.loads(body)
        choices = data["choices"]
        messages = [choice["message"] for choice in choices]
        usage = read_usage(data.get("usage"))
        if not messages:
            raise IndexError("no choices")
        thoughts = [m.get("reasoning") or m.get("reasoning_content") for m in messages]
        finishes = [choice.get("finish_reason") for choice in choices]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return malformed(url, body, type(exc).__name__)
    # Null content is an answer cut short only where the server says so; else malformed.
    texts = ["" if m.get("content") is None and (r or f == "length") else m.get("content")
             for m, r, f in zip(messages, thoughts, finishes, strict=True)]
    if not all(isinstance(t, str) for t in texts + [r for r in thoughts if r is not None]):
        return Failure(f"malformed response from {url}: message content is not text", retry=True)
    weights = [len(t) + 1 for t in texts]
    shares = _shares(usage.completion, weights)
    thinking = _shares(usage.reasoning, weights)
    tops = [_top_logprobs(choice) for choice in choices]
    return [Completion(t, prompt_tokens=usage.prompt if i == 0 else 0, completion_tokens=c,
                       top_logprobs=top, cached_tokens=usage.cached if i == 0 else 0,
                       reasoning_tokens=rt, reasoning=r or None, finish_reason=f)
            for i, (t, c, rt, top, r, f) in enumerate(zip(texts, shares, thinking, tops,
                                                          thoughts, finishes, strict=True))]


def _top_logprobs(choice: dict) -> tuple[dict[str, float], ...]:
    """Per generated token, {token: logprob} of `choice.logprobs.content[i].top_logprobs`
    (OpenAI's chat format; () when none); a token that appears twice keeps its larger one."""
    content = (choice.get("logprobs") or {}).get("content") or []
    out = []
    for position in content:
        top: dict[str, float] = {}
        for entry in (position.get("top_logprobs") or []):
            try:
                token, logprob = str(entry["token"]), float(entry["logprob"])
            except (KeyError, TypeError, ValueError):
                continue
            top[token] = max(logprob, top.get(token, float("-inf")))
        out.append(top)
    return tuple(out)
