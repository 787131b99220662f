"""Rate limits of the HTTP driver (wim/backends/http_client.py, http_limits.py), against real
aiohttp stand-ins on 127.0.0.1 whose limits are scaled down to seconds: a 429 pauses the
client and costs no record, the per-minute budgets hold, `x-ratelimit-*` headers are obeyed,
and `concurrency: auto` keeps servers of unknown size busy without queueing at them.

Busy shares and latencies are measured on the server side, over the whole run."""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import threading
import time

import pytest

from wim.backends.auto_concurrency import AutoLimit
from wim.backends.http_client import Failure, HTTPClient
from wim.backends.http_limits import parse_duration, parse_retry_after, server_wait
from wim.config import config_from_dict, judge_http
from wim.errors import ConfigError

web = pytest.importorskip("aiohttp.web")


def _reply(tokens: int = 0, completion: int | None = None) -> dict:
    """A chat completion whose `usage` counts `tokens`, half of them answered, or a prompt of
    20 and `completion` answered."""
    prompt, completion = (tokens // 2, tokens - tokens // 2) if completion is None \
        else (20, completion)
    return {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}}


class StandIn:
    """An OpenAI-style server in a thread of its own: `answer(request_body)` (a coroutine on its
    loop) gives (status, headers, JSON). Records arrival times of the answered and refused."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.answered: list[float] = []
        self.refused: list[float] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def handle(request):
            body = await request.json()
            arrived = time.monotonic()
            status, headers, data = await self.answer(body)
            (self.answered if status == 200 else self.refused).append(arrived)
            return web.json_response(data, status=status, headers=headers)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


class Window:
    """At most `n` requests per fixed window of `window_s`; above that, 429 (with Retry-After
    to the window's end, or with OpenAI's x-ratelimit headers on every reply)."""

    def __init__(self, n: int, window_s: float, headers: bool = False, tokens: int = 0) -> None:
        self.n, self.window_s, self.headers, self.tokens = n, window_s, headers, tokens
        self.start = time.monotonic()
        self.counts: dict[int, int] = {}

    async def __call__(self, body: dict):
        now = time.monotonic() - self.start
        k = int(now // self.window_s)
        left = (k + 1) * self.window_s - now
        used = self.counts.get(k, 0)
        limits = {"x-ratelimit-remaining-requests": str(max(0, self.n - used - 1)),
                  "x-ratelimit-reset-requests": f"{round(left * 1000)}ms"} if self.headers else {}
        if used >= self.n:
            limits["Retry-After"] = str(math.ceil(left))
            return 429, limits, {"error": {"message": "Rate limit reached", "type": "requests"}}
        self.counts[k] = used + 1
        return 200, limits, _reply(self.tokens)


def _ask(client: HTTPClient, n: int, **payload) -> list:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 40}], **payload}
    return client.post_many("/chat/completions", [body] * n)


def _rate(times: list[float]) -> float:
    """Requests a second between the first arrival and the last."""
    times = sorted(times)
    return (len(times) - 1) / (times[-1] - times[0])


def _ask_fresh(answer, n: int, payload: dict | None = None, **settings):
    """`n` requests from a fresh client (`settings`) to a fresh stand-in answering with
    `answer`; every one must come back answered. The server and client, closed."""
    server = StandIn(answer)
    client = HTTPClient(server.url, **settings)
    try:
        results = _ask(client, n, **(payload or {}))
    finally:
        client.close()
        server.close()
    assert not [r for r in results if isinstance(r, Failure)]
    return server, client


def test_429_pauses_the_client_and_costs_no_record():
    """Without a budget the client learns the limit from 429s alone: every request is
    answered, though `max_retries` is 0, and the 429s are counted."""
    server, client = _ask_fresh(Window(n=10, window_s=1.0), 30, concurrency=4, max_retries=0)
    assert len(server.answered) == 30 and server.refused
    assert client.stats["rate_limited"] == len(server.refused)
    assert client.stats["retries"] == 0 and client.stats["failures"] == 0


def test_without_a_budget_the_client_learns_the_servers_rate_from_its_first_pause():
    """No budget, no x-ratelimit headers, only 429 + Retry-After: after the first refused burst
    the client paces itself at the rate the server answered, so a run of 100 requests sends
    under 5% of its attempts into refusals (before the learned pace: 20% of 40 requests)."""
    server, client = _ask_fresh(Window(n=10, window_s=1.0), 100, concurrency=4, max_retries=0)
    assert len(server.answered) == 100
    assert len(server.refused) < 0.05 * (100 + len(server.refused)), len(server.refused)
    assert 0.7 * 600 <= client.stats["requests_per_minute_learned"] <= 1.05 * 600


def test_requests_per_minute_keeps_under_the_servers_limit():
    """A budget of 90% of the server's limit: sent at an even pace, so hardly a 429 (< 5%)
    and never above the budget."""
    server, _ = _ask_fresh(Window(n=10, window_s=1.0), 40, concurrency=8, max_retries=0,
                           requests_per_minute=540)
    assert len(server.refused) < 0.05 * 40
    assert _rate(server.answered + server.refused) <= 9 * 1.05


def test_tokens_per_minute_is_corrected_by_usage():
    """Each request is estimated at 40 chars / 4 + max_tokens 40 = 50 tokens, but the server
    counts 100 in `usage`: at 60,000 tokens a minute the client settles at 10 requests a second,
    not the 20 the estimate alone would give."""
    server, _ = _ask_fresh(Window(n=1000, window_s=1.0, tokens=100), 30, {"max_tokens": 40},
                           concurrency=8, tokens_per_minute=60_000)
    assert 7 <= _rate(server.answered[5:]) <= 10 * 1.1


def test_ratelimit_headers_are_obeyed():
    """The server says how many are left and when its window resets ("850ms"): the client
    waits out the reset when none are left, so it is never refused."""
    server, client = _ask_fresh(Window(n=8, window_s=1.0, headers=True), 24, concurrency=1,
                                max_retries=0)
    assert server.refused == [] and client.stats["rate_limited"] == 0


def test_header_formats():
    assert parse_duration("1s") == 1.0 and parse_duration("20ms") == 0.02
    assert parse_duration("6m0s") == 360.0 and parse_duration("1h2m3.5s") == 3723.5
    assert parse_duration("0.5") == 0.5 and parse_duration("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= parse_retry_after(later) <= 31 and parse_retry_after("7") == 7.0
    spent = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "2s",
             "x-ratelimit-remaining-tokens": "10", "x-ratelimit-reset-tokens": "6m0s"}
    assert server_wait(spent, refused=False) == 2.0  # only the spent limit's reset
    assert server_wait({**spent, "x-ratelimit-remaining-requests": "3"}, refused=False) is None
    assert server_wait({**spent, "Retry-After": "5"}, refused=True) == 5.0


class Slotted:
    """A server of `slots` that serve one request each, in `service_s` seconds: a number, or a
    function giving (seconds, completion tokens) per request, as an LLM server's time varies
    with its answer's length; the rest queue. Keeps each request's (arrival, start of service,
    end) and counts the tokens in `usage`."""

    def __init__(self, slots: int, service_s) -> None:
        self.slots = slots
        self.service = service_s if callable(service_s) else lambda: (service_s, 0)
        self.spans: list[tuple[float, float, float]] = []
        self.held = 0
        self.most = 0
        self._gate: asyncio.Semaphore | None = None

    async def __call__(self, body: dict):
        arrived = time.monotonic()
        self.held += 1
        self.most = max(self.most, self.held)
        self._gate = self._gate or asyncio.Semaphore(self.slots)
        seconds, tokens = self.service()
        async with self._gate:
            started = time.monotonic()
            await asyncio.sleep(seconds)
        self.held -= 1
        self.spans.append((arrived, started, time.monotonic()))
        return 200, {}, _reply(completion=tokens)

    def busy(self) -> float:
        """The share of slot time spent serving, from the first arrival to the last end."""
        first = min(a for a, _, _ in self.spans)
        last = max(e for _, _, e in self.spans)
        return sum(e - s for _, s, e in self.spans) / (self.slots * (last - first))

    def latency(self) -> float:
        return sum(e - a for a, _, e in self.spans) / len(self.spans)


class Batched:
    """A server with no slots, as vLLM decodes: every request in flight is in the batch, and
    each decode step gives each one token. A step takes `step_s` up to `knee` requests and
    grows in proportion beyond (the GPU's compute is spent), so more in flight than the knee
    adds latency and no throughput; nothing refuses or queues. Answers are `length()` tokens."""

    def __init__(self, knee: int, step_s: float, length) -> None:
        self.knee, self.step_s, self.length = knee, step_s, length
        self.spans: list[tuple[float, float, float]] = []
        self.most = 0
        self._running: dict[asyncio.Future, int] = {}  # a request's end -> tokens left
        self._stepping: asyncio.Task | None = None

    async def __call__(self, body: dict):
        arrived = time.monotonic()
        tokens = self.length()
        done = asyncio.get_running_loop().create_future()
        self._running[done] = tokens
        self.most = max(self.most, len(self._running))
        if self._stepping is None or self._stepping.done():
            self._stepping = asyncio.ensure_future(self._steps())
        await done
        self.spans.append((arrived, arrived, time.monotonic()))
        return 200, {}, _reply(completion=tokens)

    async def _steps(self) -> None:
        while self._running:
            await asyncio.sleep(self.step_s * max(1.0, len(self._running) / self.knee))
            for done in list(self._running):
                self._running[done] -= 1
                if self._running[done] <= 0:
                    del self._running[done]
                    done.set_result(None)

    def rate(self) -> float:
        """Replies a second from the first arrival to the last end."""
        first = min(a for a, _, _ in self.spans)
        return len(self.spans) / (max(e for _, _, e in self.spans) - first)

    def latency(self) -> float:
        return sum(e - a for a, _, e in self.spans) / len(self.spans)


def lognormal_s(median_s: float, sigma: float, seed: int = 0):
    """Service times of a lognormal spread (reply times of LLM servers are skewed so)."""
    draw = random.Random(seed)
    return lambda: (median_s * math.exp(draw.gauss(0.0, sigma)), 0)


def by_length(per_token_s: float, shortest: int, longest: int, seed: int = 0):
    """Answers log-uniform in length between `shortest` and `longest` tokens, served in time
    proportional to their length (a decoding server's time per token)."""
    draw = random.Random(seed)

    def serve() -> tuple[float, int]:
        tokens = int(math.exp(draw.uniform(math.log(shortest), math.log(longest))))
        return per_token_s * tokens, tokens
    return serve


def log_uniform(shortest: int, longest: int, seed: int = 0):
    draw = random.Random(seed)
    return lambda: int(math.exp(draw.uniform(math.log(shortest), math.log(longest))))


def _run(servers: list[Slotted], n: int, **settings) -> HTTPClient:
    standins = [StandIn(s) for s in servers]
    client = HTTPClient([s.url for s in standins], max_retries=0, **settings)
    try:
        results = _ask(client, n)
    finally:
        client.close()
        for s in standins:
            s.close()
    assert not [r for r in results if isinstance(r, Failure)]
    return client


def test_auto_concurrency_fills_a_server_without_queueing_at_it():
    """16 slots of 100 ms, not told: at least 85% busy over the whole run (slow start
    included), and no runaway: a mean latency under 2.5x a fixed 16's (a fixed 64 queues to
    3.8x). Auto holds a queue of about 20% by design (results/rate_limits.txt); a client short
    of CPU (2 shared cores) hides part of the queue from itself, hence the loose bound."""
    fixed = Slotted(16, 0.1)
    _run([fixed], 320, concurrency=16)
    auto = Slotted(16, 0.1)
    client = _run([auto], 640, concurrency="auto")
    assert auto.busy() >= 0.85, auto.busy()
    assert auto.latency() <= 2.5 * fixed.latency(), (auto.latency(), fixed.latency())
    assert 16 <= client.stats["concurrency_limit"] <= 28
    assert client.stats["concurrency_limit"] == client.stats["url0_limit"]


def test_auto_concurrency_fills_replicas_of_different_sizes():
    """Two URLs of 6 and 18 slots: each gets its own limit, so both stay busy."""
    small, large = Slotted(6, 0.1), Slotted(18, 0.1)
    client = _run([small, large], 1080, concurrency="auto")
    first = min(a for s in (small, large) for a, _, _ in s.spans)
    last = max(e for s in (small, large) for _, _, e in s.spans)
    served = sum(e - st for s in (small, large) for _, st, e in s.spans)
    assert served / (24 * (last - first)) >= 0.85
    # Not asserted: the mean latency. `auto` holds each limit about 20% over its server's size
    # (docs/design.md, "Backends"), so requests queue a little at both; measured 0.12-0.20 s
    # against fixed 24's round-robin 0.20 s, the higher figures on a loaded machine.
    assert client.stats["url0_limit"] < client.stats["url1_limit"]


def test_auto_concurrency_stays_under_max_concurrency():
    server = Slotted(16, 0.1)
    client = _run([server], 120, concurrency="auto", max_concurrency=6)
    assert server.most <= 6 and client.stats["concurrency_limit"] <= 6


def test_config_budgets_are_checked_and_inherited():
    cfg = config_from_dict({"http": {"base_urls": ["http://h/v1"], "concurrency": "auto",
                                     "requests_per_minute": 500,
                                     "tokens_per_minute": 90_000},
                            "judge": {"role": "external", "backend": "http",
                                      "http": {"max_concurrency": 32}}})
    judge = judge_http(cfg)
    assert (judge.concurrency, judge.max_concurrency) == ("auto", 32)
    assert (judge.requests_per_minute, judge.tokens_per_minute) == (500, 90_000)
    for bad in ({"http": {"concurrency": "fast"}}, {"http": {"requests_per_minute": 0}},
                {"http": {"max_concurrency": 0}}, {"scoring": {"http": {"tokens_per_minute": -1}}},
                {"scoring": {"http": {"concurrency": "many"}}}):
        with pytest.raises(ConfigError):
            config_from_dict(bad)


def test_auto_concurrency_does_not_grow_while_a_budget_holds_the_requests():
    """At 20 requests a second, replies of 100 ms need 2 in flight: requests that wait for the
    budget are not demand for more slots, so the limit stays where it started."""
    server = Slotted(16, 0.1)
    client = _run([server], 60, concurrency="auto", requests_per_minute=1200)
    # A loaded machine may let the budget's backlog go out together (13 once): bounded by the
    # limit, which did not grow.
    assert server.most <= AutoLimit.START and client.stats["concurrency_limit"] <= AutoLimit.START


def test_a_429_for_an_exhausted_quota_is_a_failure():
    """OpenAI answers 429 `insufficient_quota` when the account has no credit: no wait ends
    that, so the request fails (after its retries) instead of waiting forever."""
    async def broke(body: dict):
        return 429, {}, {"error": {"message": "You exceeded your current quota",
                                   "type": "insufficient_quota"}}

    server = StandIn(broke)
    client = HTTPClient(server.url, max_retries=1, backoff_s=0.01)
    try:
        [result] = _ask(client, 1)
    finally:
        client.close()
        server.close()
    assert isinstance(result, Failure) and "insufficient_quota" in result.reason
    assert len(server.refused) == 1 and client.stats["failures"] == 1


def test_auto_concurrency_keeps_slots_busy_when_latency_varies():
    """16 slots whose requests take a lognormal time (median 40 ms, sigma 0.6), 2,000 requests,
    told nothing: at least 85% busy over the whole run. (A floor taken as the lowest mean of
    rounds of 8 read this noise as a queue: it settled at 1 and kept the server 10% busy.)"""
    server = Slotted(16, lognormal_s(0.04, 0.6))
    _run([server], 2000, concurrency="auto")
    assert server.busy() >= 0.85, server.busy()


def test_auto_concurrency_finds_the_knee_of_a_batching_server():
    """No slots, no queue, no 429: past 16 in flight every decode step slows in proportion.
    `auto` serves at least 85% of the rate a fixed 16 (the knee) serves, and does not settle
    far past the knee, which would only add latency. (The old floor settled at 1: 12%.)
    Slow start from 32 passes the knee 2x and 4x (8x for a window when a queue reads as a
    small rise twice, about 1 run in 8 here), so the check is where it settles."""
    fixed = Batched(16, 0.003, log_uniform(5, 50, seed=1))
    _run([fixed], 600, concurrency=16)
    auto = Batched(16, 0.003, log_uniform(5, 50, seed=1))
    client = _run([auto], 1200, concurrency="auto")
    assert auto.rate() >= 0.85 * fixed.rate(), (auto.rate(), fixed.rate())
    # It settles at 20-25 (a queue of 20% held by design), 39 after a window at 128; a limit
    # that took a queued window as its base settled at 60-80.
    assert client.stats["concurrency_limit"] <= 40 and auto.most <= 128, auto.most


@pytest.mark.parametrize("second", [1.0, 1.15])
def test_only_a_clearly_flat_doubling_makes_the_first_window_the_base(second: float):
    """Slow start's three windows read 1.0, then `second`, then 2.4 s a reply. A flat second
    window doubles to 128, whose 2.4 ends slow start at 1.2 x 128 / 2.4 = 64 with the first
    window as the base. 1.15 is no rise to end on (the bar is 1.2), but it may be a queue
    read low: the level (64) is read again, and its 2.4 ends slow start with the deep probe
    (half of 64 / 2.4), since the first window may have queued."""
    limit = AutoLimit(256)
    assert limit.limit == 32
    for latency in (1.0, second, 2.4):
        epoch, replies = limit.epoch, limit.limit
        for _ in range(replies):
            limit.demand = True
            limit.on_reply(epoch, latency, 1)
    if second == 1.0:
        assert (limit.limit, limit.settled) == (64, 64)
    else:
        assert (limit.limit, limit.settled) == (13, 27)
