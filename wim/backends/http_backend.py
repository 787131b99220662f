"""Generation over HTTP from OpenAI-compatible servers (vLLM, SGLang, TGI, llama.cpp, OpenAI).

Samples of one prompt come from one request with `n=k` (vLLM, SGLang and OpenAI take it; the
server then reads the prompt once), sent concurrently from a thread pool, round-robin over the
base URLs. A server that refuses `n` (a 4xx naming it) or answers with fewer choices gets the
missing samples as single requests (`n=1`) from then on, counted (`stats["n_fallback"]`).
A request that fails with a connect error, a timeout, 429, 5xx or a malformed body is retried
with exponential backoff on the next URL; other 4xx are not retried. After `max_retries`
retries it becomes `Completion(ok=False, error=...)`: the backend never raises for a request
and never waits without a timeout. The API key is read once from an environment variable and
appears only in the Authorization header, never in reprs, errors or logs.

Guided judge format: with `SamplingParams.json_schema` the request carries a `response_format`,
first in OpenAI's form (`{"type": "json_schema", ...}`: vLLM, SGLang, OpenAI, llama.cpp's
llama-server), then, if the server refuses that with a 4xx naming the format, in the
`{"type": "json_object", "schema": ...}` form (llama-cpp-python's server, llama-server), then
none (plain text). A refusal is a 4xx whose body names the format, or a 5xx that names
`response_format` (llama-cpp-python answers an unknown format type with a 500). A refused form
is remembered for the backend's lifetime and counted (`stats["guided_refused"]`); the refusal
is not a retry of the request.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from wim.backends.base import Backend, Completion, Conversation, SamplingParams, sample_seed

logger = logging.getLogger(__name__)

_MAX_BACKOFF_S = 30.0  # one wait never exceeds this, whatever the attempt number
_BODY_SNIPPET = 120  # characters of an error body kept in the error message


@dataclass(frozen=True)
class _Failure:
    reason: str
    retry: bool
    refused_format: bool = False
    """A 4xx whose body names the response format: the server does not take it."""
    refused_n: bool = False
    """A 4xx to a request with n > 1 whose body names `n`: the server takes one sample only."""


_N_REFUSED = "the server refused n > 1"
# A refusal of n names the field: "'n' must be 1", "n must be 1", "unsupported parameter: n".
_NAMES_N = re.compile(r"""['"`]n['"`]|\bn (?:must|should|is|>|<|=)|\bn\s*[:=]|parameter:? n\b""")


# The forms of `response_format` tried in order (see the module docstring).
GUIDED_FORMS = ("json_schema", "json_object")
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "schema", "grammar")


def response_format(form: str, schema: dict) -> dict:
    """The `response_format` request field asking for JSON that matches `schema`."""
    if form == "json_schema":
        return {"type": "json_schema",
                "json_schema": {"name": "wim_judgement", "schema": schema, "strict": True}}
    return {"type": "json_object", "schema": schema}


class HTTPBackend(Backend):
    """Chat completions from one or more OpenAI-compatible base URLs (ending in `/v1`)."""

    name = "http"
    supports_prefill = False
    supports_json_schema = True

    def __init__(
        self,
        base_urls: list[str],
        model: str,
        api_key_env: str = "WIM_API_KEY",
        concurrency: int = 8,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        context_tokens: int | None = None,
    ) -> None:
        import httpx

        if isinstance(base_urls, str):
            base_urls = [base_urls]
        if not base_urls:
            raise ValueError("HTTPBackend needs at least one base URL")
        if concurrency < 1 or timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError(
                "HTTPBackend needs concurrency >= 1, timeout_s > 0, max_retries >= 0, "
                "backoff_s >= 0"
            )
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.model = model
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.context_tokens = context_tokens  # prompts are measured with the base estimate
        self.stats = {"requests": 0, "retries": 0, "failures": 0, "guided_refused": 0,
                      "n_fallback": 0}
        self._refused: set[str] = set()  # response_format forms this server refused
        self._single = False  # the server refused n > 1: one request per sample from now on
        self._lock = threading.Lock()
        self._next = 0
        self._jitter = random.Random()  # jitter only spreads retries; it never touches results
        # The key lives only in the client's headers (httpx masks it in their repr) and in
        # `_secret` for scrubbing error text; it is not an attribute anyone prints.
        key = os.environ.get(api_key_env) or ""
        self._secret = key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )

    def __repr__(self) -> str:
        key = "set" if self._secret else "unset"
        return (
            f"HTTPBackend(base_urls={self.base_urls!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r} ({key}), concurrency={self.concurrency}, "
            f"timeout_s={self.timeout_s}, max_retries={self.max_retries})"
        )

    def generate(
        self,
        conversations: list[Conversation],
        params: SamplingParams,
        *,
        n: int = 1,
        seed: int = 0,
        prefill: str | None = None,
    ) -> list[list[Completion]]:
        if prefill:
            raise ValueError("the http backend cannot prefill the assistant turn")
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="wim-http") as pool:
            futures = [pool.submit(self._samples, conv, params, n, seed, i)
                       for i, conv in enumerate(conversations)]
            return [future.result() for future in futures]  # _samples() never raises

    def _samples(self, conv: Conversation, params: SamplingParams, n: int, seed: int,
                 index: int) -> list[Completion]:
        """The n samples of one conversation: one request with n, where the server takes it;
        the samples it did not give come as single requests with their own seeds."""
        got: list[Completion] = []
        if n > 1 and not self._single:
            got = self.complete(conv, params, sample_seed(seed, index, 0), n=n)
            if got[0].ok and len(got) >= n:
                return got[:n]
            if got[0].ok or got[0].error == _N_REFUSED:
                self._fall_back(len(got) if got[0].ok else 0, n)
            if not got[0].ok:
                if got[0].error != _N_REFUSED:
                    return got + [got[0]] * (n - 1)  # a failed request fails its n samples
                got = []
        got += [self.complete(conv, params, sample_seed(seed, index, j))[0]
                for j in range(len(got), n)]
        return got

    def _fall_back(self, gave: int, n: int) -> None:
        with self._lock:
            new = not self._single
            self._single = True
            self.stats["n_fallback"] += 1
        if new:
            logger.warning("the server gave %d of n=%d samples in one request; asking once per "
                           "sample from now on", gave, n)

    def complete(self, messages: Conversation, params: SamplingParams, seed: int,
                 n: int = 1) -> list[Completion]:
        """The choices of one chat-completion request (up to `n`), with retries; a failure
        comes back as one `ok=False` completion (error `_N_REFUSED` when the server refused
        n > 1)."""
        payload: dict = {
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
        failure = _Failure("no attempt made", retry=False)
        first = self._take_index()
        attempt = 0
        while attempt <= self.max_retries:
            form = self._guided_form(payload, params.json_schema)
            # The first attempt takes its turn in the round-robin; each retry moves on to the
            # URL after the one that failed, so one dead server cannot take every attempt.
            url = self.base_urls[(first + attempt) % len(self.base_urls)] + "/chat/completions"
            self._count("requests")
            try:
                outcome = self._attempt(url, payload)
            except Exception as exc:  # never raise out of a worker thread
                outcome = _Failure(f"{type(exc).__name__} from {url}: {exc}", retry=False)
            if isinstance(outcome, list):
                return outcome
            if n > 1 and outcome.refused_n:
                return [Completion("", ok=False, error=_N_REFUSED)]
            if form is not None and outcome.refused_format:
                self._refuse(form, outcome.reason)
                continue  # the same attempt again, with the next form or plain text
            failure = outcome
            attempt += 1
            logger.debug("attempt %d failed: %s", attempt, self._scrub(failure.reason))
            if not failure.retry or attempt > self.max_retries:
                break
            self._count("retries")
            time.sleep(self._backoff(attempt))
        self._count("failures")
        tries = attempt
        error = self._scrub(f"{failure.reason} (after {tries} attempt{'s' * (tries > 1)})")
        logger.warning("http request failed: %s", error)
        return [Completion("", ok=False, error=error)]

    def _attempt(self, url: str, payload: dict) -> list[Completion] | _Failure:
        import httpx

        # httpx timeouts bound each connect and each read; the deadline bounds the whole body,
        # so even a server that trickles bytes ends the attempt within a few timeout_s.
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._client.stream("POST", url, json=payload) as response:
                chunks = []
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        return _Failure(f"timeout after {self.timeout_s}s from {url}", retry=True)
                body = b"".join(chunks)
        except httpx.TimeoutException as exc:
            return _Failure(f"timeout ({type(exc).__name__}) from {url}", retry=True)
        except httpx.TransportError as exc:  # refused, reset, closed mid-reply, DNS
            return _Failure(f"{type(exc).__name__} from {url}: {exc}", retry=True)
        status = response.status_code
        if status != 200:
            snippet = body[:_BODY_SNIPPET].decode("utf-8", errors="replace")
            retry = status == 429 or status >= 500
            text = body[:4000].decode("utf-8", errors="replace").lower()
            # llama-cpp-python's server answers a request it cannot validate with a 500 that
            # names the field; a 5xx that does not name it is an ordinary server error.
            refused = ((400 <= status < 500 and status != 429
                        and any(w in text for w in _FORMAT_WORDS))
                       or (status >= 500 and "response_format" in text))
            refused_n = (payload["n"] > 1 and 400 <= status < 500 and status != 429
                         and _NAMES_N.search(text) is not None)
            return _Failure(f"HTTP {status} from {url}: {snippet}", retry=retry,
                            refused_format=refused and not refused_n, refused_n=refused_n)
        return _parse(body, url)

    def _guided_form(self, payload: dict, schema: dict | None) -> str | None:
        """Set `payload["response_format"]` to the first form not refused; the form or None."""
        payload.pop("response_format", None)
        if schema is None:
            return None
        with self._lock:
            form = next((f for f in GUIDED_FORMS if f not in self._refused), None)
        if form is not None:
            payload["response_format"] = response_format(form, schema)
        return form

    def _refuse(self, form: str, reason: str) -> None:
        with self._lock:
            new = form not in self._refused
            self._refused.add(form)
            self.stats["guided_refused"] += 1
        if new:
            after = next((f for f in GUIDED_FORMS if f not in self._refused), "plain text")
            logger.warning("the server refused response_format %r (%s); using %s instead",
                           form, self._scrub(reason), after)

    def _take_index(self) -> int:
        with self._lock:
            index = self._next % len(self.base_urls)
            self._next += 1
        return index

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _backoff(self, attempt: int) -> float:
        wait = min(self.backoff_s * 2 ** (attempt - 1), _MAX_BACKOFF_S)
        return wait + self._jitter.uniform(0, 0.1 * wait)

    def _scrub(self, text: str) -> str:
        """One line, without the API key (a server may echo the Authorization header)."""
        text = " ".join(text.split())
        if self._secret:
            text = text.replace(self._secret, "***")
        return text

    def close(self) -> None:
        self._client.close()


def _parse(body: bytes, url: str) -> list[Completion] | _Failure:
    """The choices of a chat-completion body, or a retryable failure if it is malformed.

    The prompt is read once per request, so its tokens go to the first choice; the completion
    tokens (one total in `usage`) are shared out by the choices' text lengths."""
    try:
        data = json.loads(body)
        texts = [choice["message"]["content"] for choice in data["choices"]]
        usage = data.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        if not texts:
            raise IndexError("no choices")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        snippet = body[:_BODY_SNIPPET].decode("utf-8", errors="replace")
        return _Failure(
            f"malformed response from {url} ({type(exc).__name__}): {snippet}", retry=True
        )
    if not all(isinstance(t, str) for t in texts):
        return _Failure(f"malformed response from {url}: message content is not text", retry=True)
    weights = [len(t) + 1 for t in texts]
    shares = [completion_tokens * w // sum(weights) for w in weights]
    shares[0] += completion_tokens - sum(shares)  # the rounding remainder, so the sum is exact
    tops = [_top_logprobs(choice) for choice in data["choices"]]
    return [Completion(t, prompt_tokens=prompt_tokens if i == 0 else 0, completion_tokens=c,
                       top_logprobs=top)
            for i, (t, c, top) in enumerate(zip(texts, shares, tops, strict=True))]


def _top_logprobs(choice: dict) -> tuple[dict[str, float], ...]:
    """Per generated token, {token: logprob} of its `top_logprobs` (OpenAI's chat format:
    `choice.logprobs.content[i].top_logprobs`); () when the server sent none. A token that
    appears twice keeps its larger logprob."""
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
