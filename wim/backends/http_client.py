"""The transport of the HTTP backends and the HTTP embedder: JSON POSTs to one or more base
URLs from any thread, every request of every caller under one in-flight cap (docs/design.md,
"Backends", says why each rule is there).

aiohttp on an asyncio event loop in one background thread per client: of the HTTP clients, it
costs the least CPU per request, and on a driver's few cores that CPU decides how many requests
a second it sends (docs/benchmarks.md, tests/benchmarks/bench_scale.py). Requests of every
caller share `concurrency` slots over all base URLs, first come, first served (a stage's
earlier batches go first), so a finished request is replaced at once from whichever caller.

An attempt holds a slot, a backoff does not. A connect error, a dropped connection, a timeout
(`timeout_s` bounds the whole reply, so a server that trickles bytes cannot hold a slot), a
5xx or a body its `parse` calls malformed is retried with exponential backoff on the next base
URL; 4xx are not. After `max_retries` retries it comes back as a `Failure`: nothing here raises
for a request. Rate limits (`Limits`, http_limits.py) hold the whole client: a 429 pauses
every request until the server's `Retry-After` and is sent again, not as a retry (unless it
says `insufficient_quota`); budgets pace the sends; under `concurrency="auto"` each URL has
its own limit and a request goes to the freest.

A URL that refuses connections (or cannot be reached) is down for a cooldown (2 s, doubling
while it stays down, at most 60 s) and requests go round-robin over the others; one that could
not connect reached no server, so it moves to an up URL at once, without a backoff or a retry
(a failover, once per other URL, so `max_retries: 0` still fails over). After the cooldown
one request probes the URL; a success brings it back. When every URL is down, requests go
round-robin over all and wait out backoffs.

Counts (`stats`; the stages report them as `http/<role>/<name>`): `requests` (attempts sent),
`retries`, `failures` (requests given up), `failovers`; per base URL, by its position,
`url<i>_requests`, `url<i>_errors` (failed attempts), `url<i>_down` (times marked down);
`Limits` adds `rate_limited`, `concurrency_limit` and `url<i>_limit`. The API key is read once
from an environment variable and appears only in the Authorization header (`scrub` removes it
from any text a server echoes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from wim.backends.http_limits import Limits

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_BACKOFF_S = 30.0  # one wait never exceeds this, whatever the attempt number
BODY_SNIPPET = 120  # characters of an error body kept in the error message
COOLDOWN_S = 2.0  # a URL that refused a connection is left alone this long, then probed
MAX_COOLDOWN_S = 60.0
_CONNECT_TIMEOUT_S = 10.0  # a host that drops packets is known down after this, not timeout_s
_LOGGED_FAILURES = 5  # failed requests logged as warnings; later ones only at DEBUG


@dataclass(frozen=True)
class Failure:
    """A request that did not give a result: `reason` is one line without the API key."""

    reason: str
    retry: bool = False  #: worth another attempt (timeout, connection, 5xx, malformed body)
    repeat: bool = False  #: send again at once, not an attempt (the caller changed the payload)
    connection: bool = False  #: it reached no server, so another URL may take it at once
    rate_limited: bool = False  #: a 429: sent again after the pause it set, not an attempt


Parse = Callable[[int, bytes, str], Any]
"""(HTTP status, body, url) -> the result, or a `Failure`."""


def http_failure(status: int, body: bytes, url: str) -> Failure:
    """The failure of a non-200 reply: 5xx are retried (a 429 reaches `parse` only when it says
    `insufficient_quota`: waiting does not end that)."""
    snippet = body[:BODY_SNIPPET].decode("utf-8", errors="replace")
    return Failure(f"HTTP {status} from {url}: {snippet}", retry=status >= 500)


def parse_json(status: int, body: bytes, url: str) -> dict | Failure:
    """A 200 reply's JSON object; a body that is not one is malformed (retried)."""
    if status != 200:
        return http_failure(status, body, url)
    try:
        data = json.loads(body)
    except ValueError as exc:
        return malformed(url, body, type(exc).__name__)
    return data if isinstance(data, dict) else malformed(url, body, "not a JSON object")


def malformed(url: str, body: bytes, kind: str) -> Failure:
    """A 200 reply whose body is not what was asked for: retried."""
    snippet = body[:BODY_SNIPPET].decode("utf-8", errors="replace")
    return Failure(f"malformed response from {url} ({kind}): {snippet}", retry=True)


class HTTPClient:
    """POSTs of JSON to `base_urls` (each ending in `/v1`), at most `concurrency` at once over
    all of them ("auto": found from the replies, at most `max_concurrency`), within the
    per-minute budgets, with retries (docs/design.md). Thread-safe; `close()` when done."""

    def __init__(
        self,
        base_urls: list[str] | str,
        api_key_env: str = "WIM_API_KEY",
        concurrency: int | str = 8,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_concurrency: int = 256,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
    ) -> None:
        if isinstance(base_urls, str):
            base_urls = [base_urls]
        if not base_urls:
            raise ValueError("an HTTP client needs at least one base URL")
        if timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError("an HTTP client needs timeout_s > 0, max_retries >= 0, backoff_s >= 0")
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.cooldown_s = COOLDOWN_S
        self.max_concurrency = max_concurrency
        self.stats = dict.fromkeys(["requests", "retries", "failures", "failovers"], 0)
        self.stats.update({f"url{i}_{name}": 0 for i in range(len(self.base_urls))
                           for name in ("requests", "errors", "down")})
        # Everything below is touched only on the loop's thread: no locks.
        self._limits = Limits(len(self.base_urls), concurrency, max_concurrency,
                              requests_per_minute, tokens_per_minute, self.stats, self._backoff)
        self._next = 0  # round-robin position
        self._down_until: list[float | None] = [None] * len(self.base_urls)  # None: up
        self._down_streak = [0] * len(self.base_urls)
        self._jitter = random.Random()  # spreads retries only; never touches results
        self._session = None
        self._secret = os.environ.get(api_key_env) or ""
        self._headers = {"Content-Type": "application/json"}
        if self._secret:
            self._headers["Authorization"] = f"Bearer {self._secret}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                         name="wim-http-loop")
        self._thread.start()
        self._holder: list = []  # the session, for the finalizer (which must not hold self)
        self._closer = weakref.finalize(self, _shutdown, self._loop, self._thread, self._holder)

    def __repr__(self) -> str:
        key = "set" if self._secret else "unset"
        return (f"HTTPClient(base_urls={self.base_urls!r}, api_key_env={self.api_key_env!r} "
                f"({key}), concurrency={self.concurrency}, timeout_s={self.timeout_s}, "
                f"max_retries={self.max_retries})")

    # -- from any thread ------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """The result of a coroutine run on the client's loop (from any thread but its own)."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # an interrupted caller takes its requests with it
            raise

    def post_json(self, path: str, payload: dict, parse: Parse = parse_json) -> Any:
        """POST `payload` to `<base url><path>` with retries: `parse`'s result or a `Failure`."""
        return self.run(self.request(path, payload, parse))

    def post_many(self, path: str, payloads: list[dict], parse: Parse = parse_json) -> list:
        """`post_json` for each payload, all in flight together (up to the cap), in order."""
        return self.run(self.gather([self.request(path, p, parse) for p in payloads]))

    def close(self) -> None:
        self._closer()

    # -- on the loop ----------------------------------------------------------------------

    @staticmethod
    async def gather(aws: list[Awaitable[T]]) -> list[T]:
        return list(await asyncio.gather(*aws))

    async def request(self, path: str, payload: dict | Callable[[], dict | None],
                      parse: Parse = parse_json) -> Any:
        """One request with retries (a coroutine on the client's loop). `payload` may be a
        function, called before each attempt once a slot is free and on a `repeat`, for a
        payload that changes meanwhile; when it returns None, nothing is sent (result None)."""
        attempt, hops, failure = 0, 0, Failure("no attempt made")
        index: int | None = None  # the URL of the last attempt
        while True:
            index, outcome = await self._attempt(path, payload, parse, after=index)
            if not isinstance(outcome, Failure):
                return outcome
            if outcome.rate_limited:  # the whole client waits (see _send); then again
                continue
            if (outcome.connection and hops < len(self.base_urls) - 1
                    and any(u is None for i, u in enumerate(self._down_until) if i != index)):
                # It never reached a server: a URL that is up takes it at once, and it is not
                # an attempt (max_retries: 0 still fails over). Once per other URL at most.
                hops += 1
                self.stats["failovers"] += 1
                continue
            failure = outcome
            attempt += 1
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("attempt %d failed: %s", attempt, self.scrub(failure.reason))
            if not failure.retry or attempt > self.max_retries:
                break
            self.stats["retries"] += 1
            await asyncio.sleep(self._backoff(attempt))
        self.stats["failures"] += 1
        failed = self.stats["failures"]  # the first few are warnings
        error = self.scrub(f"{failure.reason} (after {attempt} attempt{'s' * (attempt > 1)})")
        logger.log(logging.WARNING if failed <= _LOGGED_FAILURES else logging.DEBUG,
                   "http request failed: %s%s", error,
                   "; further failures are counted in stats, logged at DEBUG"
                   if failed == _LOGGED_FAILURES else "")
        return Failure(error)

    async def _attempt(self, path: str, payload: dict | Callable[[], dict | None],
                       parse: Parse, after: int | None) -> tuple[int | None, Any]:
        """(URL index, outcome) of one attempt in one slot. The URL is picked once the slot is
        free, so that a URL found down meanwhile is not sent to."""
        await self._limits.acquire()
        index = None
        try:
            index = self._pick(after)
            self._limits.busy[index] += 1
            while True:
                data = payload() if callable(payload) else payload
                if data is None:
                    return index, None
                cost = await self._limits.pace(data)
                outcome = await self._send(index, self.base_urls[index] + path, data, parse,
                                           cost)
                if not (isinstance(outcome, Failure) and outcome.repeat):
                    return index, outcome
        finally:
            if index is not None:
                self._limits.busy[index] -= 1
            self._limits.slots.release()

    async def _send(self, index: int, url: str, data: dict, parse: Parse,
                    cost: int | None = None) -> Any:
        import aiohttp

        self.stats["requests"] += 1
        self.stats[f"url{index}_requests"] += 1
        epoch = self._limits.epoch(index)
        start = time.monotonic()
        try:
            session = self._session or self._open()
            async with session.post(url, data=json.dumps(data).encode(),
                                    headers=self._headers) as response:
                status, reply, headers = response.status, await response.read(), response.headers
            self._limits.heed(self.base_urls[index], index, epoch, status, headers, reply, cost,
                              time.monotonic() - start)
            if status == 429 and b"insufficient_quota" not in reply:
                outcome = Failure(http_failure(status, reply, url).reason, rate_limited=True)
            else:
                outcome = parse(status, reply, url)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            outcome = Failure(f"{type(exc).__name__} from {url}: {exc}", retry=True,
                              connection=True)
            self._mark_down(index, outcome.reason)
        except (asyncio.TimeoutError, TimeoutError):
            outcome = Failure(f"timeout after {self.timeout_s}s from {url}", retry=True)
        except aiohttp.ClientError as exc:  # dropped mid-reply (the server may have it), reset
            outcome = Failure(f"{type(exc).__name__} from {url}: {exc}", retry=True)
        except Exception as exc:  # a bug in parse, say: one failed request, not a crash
            outcome = Failure(f"{type(exc).__name__} from {url}: {exc}")
        if isinstance(outcome, Failure):
            self.stats[f"url{index}_errors"] += 1
        elif self._down_until[index] is not None:
            self._down_until[index], self._down_streak[index] = None, 0
            logger.warning("%s answers again", self.base_urls[index])
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("POST %s: %s in %.1f ms", url,
                         self.scrub(outcome.reason) if isinstance(outcome, Failure) else "ok",
                         1000 * (time.monotonic() - start))
        return outcome

    def _open(self):
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.timeout_s,
                                        sock_connect=min(self.timeout_s, _CONNECT_TIMEOUT_S))
        # The semaphore is the cap; the connector's own limit would only add a second queue.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        self._holder.append(self._session)
        return self._session

    def _pick(self, after: int | None = None) -> int:
        """The URL for an attempt: the next one up in round-robin order (after `after` for a
        retry; under auto, the up one with the most free slots), or a down one whose cooldown
        has passed (one probe per cooldown); when all are down and cooling, round-robin."""
        n = len(self.base_urls)
        if after is None:
            start, self._next = self._next, self._next + 1
        else:
            start = after + 1
        now = time.monotonic()
        limits, best = self._limits, None
        for k in range(n):
            i = (start + k) % n
            until = self._down_until[i]
            if until is None:
                if not limits.auto:
                    return i
                if best is None or limits.room(i) > limits.room(best):
                    best = i
            elif until <= now:
                self._down_until[i] = now + self._cooldown(i)
                return i
        return start % n if best is None else best

    def _mark_down(self, index: int, reason: str) -> None:
        if self._down_until[index] is None:
            self.stats[f"url{index}_down"] += 1
            logger.warning("%s is down (%s)%s", self.base_urls[index], self.scrub(reason),
                           "; its requests go to the other URLs" if len(self.base_urls) > 1 else "")
        self._down_streak[index] += 1
        self._down_until[index] = time.monotonic() + self._cooldown(index)

    def _cooldown(self, index: int) -> float:
        return min(self.cooldown_s * 2 ** max(0, self._down_streak[index] - 1), MAX_COOLDOWN_S)

    def _backoff(self, attempt: int) -> float:
        wait = min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
        return wait + self._jitter.uniform(0, 0.1 * wait)

    def scrub(self, text: str) -> str:
        """One line, without the API key (a server may echo the Authorization header)."""
        text = " ".join(text.split())
        if self._secret:
            text = text.replace(self._secret, "***")
        return text


def _shutdown(loop: asyncio.AbstractEventLoop, thread: threading.Thread, holder: list) -> None:
    """Close the session on its loop, then stop the loop and its thread."""
    if loop.is_closed():
        return

    async def close() -> None:
        for session in holder:
            await session.close()

    if thread.is_alive() and threading.current_thread() is not thread:
        with contextlib.suppress(Exception):  # closing must not fail the caller
            asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
    if not loop.is_running():
        loop.close()
