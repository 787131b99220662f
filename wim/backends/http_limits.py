"""How fast the HTTP driver (http_client.py) may send: in-flight slots, per-minute budgets,
the server's rate-limit headers and `concurrency: auto` (each URL's limit: auto_concurrency.py),
together in `Limits` (docs/design.md, "Backends", says why). All of it runs on the driver's
loop thread only: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import re
import time
from collections import deque

from wim.backends.auto_concurrency import AutoLimit

logger = logging.getLogger("wim.backends.http_client")  # the driver's logger: one to configure

CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb, and how its limiter estimates a prompt


def estimated_tokens(payload: dict) -> int:
    """A request's cost against a token budget, as OpenAI's limiter counts it: prompt characters
    / 4 plus `max_tokens` x `n`; the reply's `usage` corrects it afterwards."""
    chars = sum(_text_chars(payload.get(key)) for key in ("messages", "prompt", "input"))
    most = payload.get("max_completion_tokens") or payload.get("max_tokens") or 0
    n = payload.get("n") or 1
    return max(1, chars // CHARS_PER_TOKEN + int(most) * int(n))


def _text_chars(value) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return sum(map(_text_chars, value))
    return len(value) if isinstance(value, str) else 0


class Slots:
    """At most `limit` holders, first come first served (an asyncio.Semaphore cannot shrink)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.busy = 0
        self.waiters: deque[asyncio.Future] = deque()  # requests waiting: demand above limit

    def resize(self, limit: int) -> None:
        """Lower lets the holders finish; higher wakes waiters at once."""
        self.limit = limit
        self._wake()

    async def acquire(self) -> None:
        if self.busy < self.limit and not self.waiters:
            self.busy += 1
            return
        future = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        try:
            await future  # the releaser counted us in `busy`
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted as we were cancelled: pass it on
            else:
                self.waiters.remove(future)
            raise

    def release(self) -> None:
        self.busy -= 1
        self._wake()

    def _wake(self) -> None:
        while self.waiters and self.busy < self.limit:
            future = self.waiters.popleft()
            if not future.done():
                self.busy += 1
                future.set_result(None)


class Budget:
    """`per_minute` units (requests or tokens) as an even pace over all the section's URLs (a
    generic cell rate), not a bucket that fills for a minute: no bursts (docs/design.md)."""

    def __init__(self, per_minute: float) -> None:
        self.rate = per_minute / 60.0
        self._free_at = 0.0  # monotonic time from which the next unit may go

    def reserve(self, cost: float) -> float:
        """Take `cost` units now; the seconds to wait before sending."""
        now = time.monotonic()
        start = max(self._free_at, now)
        self._free_at = start + cost / self.rate
        return start - now

    def correct(self, delta: float) -> None:
        """The reply used `delta` units more (or fewer, when negative) than reserved."""
        self._free_at = max(time.monotonic(), self._free_at + delta / self.rate) \
            if delta < 0 else self._free_at + delta / self.rate


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str | None) -> float | None:
    """OpenAI's reset times ("1s", "6m0s", "20ms", "1h2m3.5s") or seconds; None if unreadable."""
    if not text:
        return None
    text = text.strip()
    with contextlib.suppress(ValueError):
        return max(0.0, float(text))
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def parse_retry_after(text: str | None) -> float | None:
    """`Retry-After` as seconds from now (delta-seconds or an HTTP date); None when unreadable."""
    if not text:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(text.strip()))
    try:
        when = email.utils.parsedate_to_datetime(text.strip())
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def server_wait(headers, refused: bool) -> float | None:
    """Seconds the server asks the section to wait: a 429's `Retry-After`, else the longer reset
    of a limit with 0 remaining, else for a 429 the longer reset; None when none is asked."""
    wait = parse_retry_after(headers.get("Retry-After")) if refused else None
    if wait is not None:
        return wait
    resets, spent = [], []
    for kind in ("requests", "tokens"):
        reset = parse_duration(headers.get(f"x-ratelimit-reset-{kind}"))
        if reset is not None:
            resets.append(reset)
            if parse_duration(headers.get(f"x-ratelimit-remaining-{kind}", "1")) == 0:
                spent.append(reset)
    waits = spent or (resets if refused else [])  # refused, no limit spent: the longer reset
    return max(waits) if waits else None


class Limits:
    """The sending limits of one client (one endpoint section) over all its URLs; keeps
    `rate_limited`, `concurrency_limit` and `url<i>_limit` in the client's `stats`."""

    def __init__(self, urls: int, concurrency: int | str, max_concurrency: int,
                 requests_per_minute: float | None, tokens_per_minute: float | None,
                 stats: dict, backoff) -> None:
        if (concurrency != "auto" and (not isinstance(concurrency, int) or concurrency < 1)) \
                or max_concurrency < 1 or any(b is not None and b <= 0 for b in (
                    requests_per_minute, tokens_per_minute)):
            raise ValueError("an HTTP client needs concurrency >= 1 or 'auto', max_concurrency "
                             ">= 1 and positive per-minute budgets")
        self.max_concurrency = max_concurrency
        self.auto = [AutoLimit(max_concurrency, urls) for _ in range(urls)] \
            if concurrency == "auto" else []
        self.slots = Slots(0 if self.auto else concurrency)
        self.busy = [0] * urls  # attempts in flight per URL
        self.stats = stats
        self.stats["rate_limited"] = 0
        self._requests = Budget(requests_per_minute) if requests_per_minute else None
        self._tokens = Budget(tokens_per_minute) if tokens_per_minute else None
        self._backoff = backoff  # attempt number -> seconds, for a 429 that names no wait
        self._paused_until = 0.0  # monotonic time: nothing is sent before it
        self._refused_in_row = 0  # 429s since the last reply that was not one
        # Without a request budget one is learned from the server's first pause (_learn_budget).
        self._learn = requests_per_minute is None
        self._resumed_at: float | None = None  # the first send
        self._answered = 0  # replies since the first send, then since the last 429
        self._waiting = 0  # slots held by requests that wait for a budget or a pause
        self._set_cap()

    async def acquire(self) -> None:
        """A slot under the cap (first come, first served)."""
        # Full slots that the budgets do not hold: a larger limit would put more in flight.
        if self.auto and self.slots.busy >= self.slots.limit and not self._waiting:
            for auto in self.auto:
                auto.demand = True
        await self.slots.acquire()

    def room(self, index: int) -> int:
        """Free slots of a URL's own limit under auto."""
        return self.auto[index].limit - self.busy[index]

    async def pace(self, data: dict) -> int | None:
        """Wait for the budgets and any pause; `data`'s estimated cost under a token budget."""
        cost = estimated_tokens(data) if self._tokens else None
        if self._resumed_at is None:
            self._resumed_at = time.monotonic()
        wait = self._requests.reserve(1) if self._requests else 0.0
        if self._tokens:
            wait = max(wait, self._tokens.reserve(cost))
        self._waiting += 1
        try:
            if wait > 0:
                await asyncio.sleep(wait)
            while (left := self._paused_until - time.monotonic()) > 0:
                await asyncio.sleep(left)
        finally:
            self._waiting -= 1
        return cost

    def epoch(self, index: int) -> int:
        return self.auto[index].epoch if self.auto else 0

    def heed(self, url: str, index: int, epoch: int, status: int, headers, reply: bytes,
             cost: int | None, latency_s: float) -> None:
        """What a reply tells: a pause asked for, tokens used, (under auto) latency or refusal."""
        refused = status == 429
        wait = server_wait(headers, refused)
        if refused:
            self.stats["rate_limited"] += 1
            self._refused_in_row += 1
            if wait is None:  # no header says how long: back off as for a retry
                wait = self._backoff(self._refused_in_row)
            else:
                self._learn_budget(wait)
        else:
            self._refused_in_row = 0
            self._answered += status == 200
        if wait and time.monotonic() + wait > self._paused_until:
            self._paused_until = time.monotonic() + wait
            if refused:
                logger.info("rate limited by %s: pausing %.1f s", url, wait)
        if self._tokens and cost is not None and status == 200:
            used = usage_tokens(reply)
            if used is not None:
                self._tokens.correct(used - cost)
        if not self.auto or status not in (200, 429, 503):
            return
        auto = self.auto[index]
        if status != 200:
            changed = auto.on_refusal(epoch)
        else:
            if self.slots.waiters and not self._waiting:
                auto.demand = True
            changed = auto.on_reply(epoch, latency_s, completion_tokens(reply))
        if changed:
            self._set_cap()

    def _learn_budget(self, wait: float) -> None:
        """A 429 that names its wait, without `requests_per_minute`: the server's rate from the
        first send to the end of this pause becomes the request budget; a later such 429 lowers
        it by 5% (Retry-After in whole seconds ends a pause late, so a second window would
        measure too low)."""
        if not self._learn or not self._answered or self._resumed_at is None:
            return  # the rest of a burst refused together: one pause, one change
        if self._requests is None:
            per_minute = 60.0 * self._answered / (time.monotonic() + wait - self._resumed_at)
            self._requests = Budget(per_minute)
        else:
            self._requests.rate *= 0.95
        self.stats["requests_per_minute_learned"] = round(60.0 * self._requests.rate, 1)
        self._answered = 0

    def _set_cap(self) -> None:
        """The in-flight cap: fixed, or under auto the sum of the URLs' limits."""
        if not self.auto:
            self.stats["concurrency_limit"] = self.slots.limit
            return
        self.slots.resize(min(self.max_concurrency, sum(a.limit for a in self.auto)))
        self.stats.update({f"url{i}_limit": auto.settled for i, auto in enumerate(self.auto)})
        self.stats["concurrency_limit"] = min(self.max_concurrency,
                                              sum(a.settled for a in self.auto))


def completion_tokens(reply: bytes) -> int | None:
    """The reply's `usage.completion_tokens` (reasoning included), if it has one: what a
    decoding server's time goes with, so `auto` reads latency per token."""
    try:
        tokens = json.loads(reply).get("usage").get("completion_tokens")
    except (ValueError, AttributeError):
        return None
    return tokens if isinstance(tokens, int) else None


def usage_tokens(reply: bytes) -> int | None:
    """The tokens a reply's `usage` counts (total, else prompt + completion), if it has one."""
    try:
        usage = json.loads(reply).get("usage")
        total = usage.get("total_tokens")
    except (ValueError, AttributeError):
        return None
    if isinstance(total, int):
        return total
    parts = [p for p in (usage.get("prompt_tokens"), usage.get("completion_tokens"))
             if isinstance(p, int)]
    return sum(parts) if parts else None
