"""`http.concurrency: auto`: the in-flight limit of one URL, found from the replies' latency
per output token (docs/design.md, "Backends", says why this measure and not throughput).

Rules it keeps:
- A window is a run of replies to requests sent under the current limit (its epoch); replies to
  requests sent before a change are not counted. Its measure is the window's latency over its
  completion tokens (`usage.completion_tokens`; a reply without one counts as one token): a
  ratio of sums, so a window of long answers is not read as a queue. A window is one limit's
  worth of replies (at least 8) in slow start, in a probe and after a decrease; two limits'
  worth (at least 16) otherwise.
- Slow start from 32 in flight (over a client's URLs, at least 4 each): the first window is
  the reference. A window more than 1.2x the reference and 2.5 standard errors above it (the
  spread of the replies, both ratios) ends slow start; any other doubles the limit while
  requests wait for slots. Only a clearly flat one (under 5% over the reference) joins it and
  counts as a doubling passed: a window's first replies after a change are its fastest, so a
  queue can read as a small rise. After a small rise the level is read once more (later
  replies, no longer the fastest) before it doubles.
- The unloaded latency (the base) is measured, never a minimum (noise biases a minimum low, and
  the gradient then reads noise as a queue). When a doubling passed, the reference was not
  queued: it is the first base, and slow start's end sets the limit to 1.2 x limit / rise
  (the server's size and the headroom below). When none passed, the first window may have
  queued already (a server of fewer than 32 slots): the limit goes to limit / rise after a
  probe, one window at half of that, which measures the base. Then every 12th window probes
  at 3/4, and any window at or under the last probe's limit counts too; the base is a moving
  average of those windows, each weighing as much as all before it.
- Each window then: a rise under 5% grows the limit by 25%; otherwise the limit moves half way
  to 1.2 x limit / rise (a queue of 20%, so the server never idles between replies), at most
  25% up, and only while requests wait for slots. A 429 or 503 halves it, once per epoch.
- After a decrease one window is not judged: it still waits behind the old queue.
"""

from __future__ import annotations

import math


class AutoLimit:
    """The in-flight limit of one URL, between 1 and `most`; `demand` is set by the caller
    while requests wait for slots (docs/design.md, "Backends")."""

    START = 32  # over all URLs of a client: each starts at START / URLs, at least 4
    SLOW_START_MIN = 8  # replies in a slow-start or short window, at least
    WINDOW_MIN = 16  # replies in a judged window, at least (two limits' worth)
    Z = 2.5  # a rise is only a rise if this many standard errors
    GROW_BELOW = 1.05
    HEADROOM = 1.2
    GAIN = 0.5
    MAX_STEP = 1.25
    DEADBAND = 0.05
    PROBE_EVERY = 12
    KEEP = 0.5  # weight of the older base each time a window joins it
    EXIT_PROBE = 0.5  # slow start's end probes at half its estimate when no doubling passed

    def __init__(self, most: int, urls: int = 1) -> None:
        self.most = most
        self.limit = min(max(4, self.START // urls), most)
        self.epoch = 0  # bumped on each change: replies to requests sent before it not counted
        self.demand = False
        self._slow = True
        self._reference: tuple[float, float, float] | None = None  # slow start's sums
        self._base: tuple[float, float, float] | None = None  # the probes' average
        self._probe_back: int | None = None  # the limit to go back to after a probe
        self._windows = 0  # judged windows since the last probe
        self._probed_at = 0  # the last probe's limit
        self._doubled = False  # a doubling passed: the reference was not queued
        self._held = False  # slow start reads this level again after a small rise
        self._skip = False  # the window after a decrease
        self._sums = [0, 0.0, 0.0, 0.0, 0.0, 0.0]  # n, latency, tokens, and their squares

    @property
    def settled(self) -> int:
        """The limit it works at (not the lower one of a probe)."""
        return self._probe_back or self.limit

    def on_reply(self, epoch: int, latency_s: float, tokens: int | None = None) -> bool:
        """A 200 to a request sent in `epoch` took `latency_s` for `tokens` completion tokens;
        True when the limit changed."""
        if epoch != self.epoch:
            return False
        t = max(1, tokens or 1)
        s = self._sums
        s[0] += 1
        s[1] += latency_s
        s[2] += t
        s[3] += latency_s * latency_s
        s[4] += t * t
        s[5] += latency_s * t
        short = self._slow or self._skip or self._probe_back is not None
        if s[0] < (max(self.limit, self.SLOW_START_MIN) if short
                   else max(2 * self.limit, self.WINDOW_MIN)):
            return False
        n, latency, tokens_sum, latency2, tokens2, cross = s
        ratio = latency / tokens_sum
        # The ratio estimator's variance: the spread of latency around ratio x tokens.
        spread = max(0.0, latency2 - 2 * ratio * cross + ratio * ratio * tokens2)
        self._sums = [0, 0.0, 0.0, 0.0, 0.0, 0.0]
        if self._skip:
            self._skip = False
            return False
        return self._judge((latency, tokens_sum, spread))

    def on_refusal(self, epoch: int) -> bool:
        """A 429 or 503 to a request sent in `epoch`: halve, once per epoch."""
        if epoch != self.epoch:
            return False
        self._slow = False
        self._probe_back = None
        return self._set(self.limit // 2)

    def _judge(self, window: tuple[float, float, float]) -> bool:
        if self._slow:
            return self._slow_start(window)
        if self._probe_back is not None:  # a probe's window: the base, then back
            back, self._probe_back = self._probe_back, None
            self._probed_at, self._windows = self.limit, 0
            self._base = _averaged(self._base, window, self.KEEP)
            return self._set(back)
        if self._base is None:  # slow start ended by a refusal: measure the base first
            return self._probe(self.limit)
        rise, _ = _rise(window, self._base)
        if self.limit <= self._probed_at:  # no more in flight than at the probe: a base too
            self._base = _averaged(self._base, window, self.KEEP)
        self._windows += 1
        if self._windows % self.PROBE_EVERY == 0 and self.limit > 1:
            return self._probe(self.limit)
        if rise < self.GROW_BELOW:
            return self._set(math.ceil(self.limit * self.MAX_STEP) if self.demand else self.limit)
        target = min(self.HEADROOM * self.limit / rise, self.limit * self.MAX_STEP)
        if (target > self.limit and not self.demand) \
                or abs(target - self.limit) < max(1.0, self.DEADBAND * self.limit):
            return self._set(self.limit)
        step = self.GAIN * (target - self.limit)
        return self._set(self.limit + (math.ceil(step) if step > 0 else math.floor(step)))

    def _slow_start(self, window: tuple[float, float, float]) -> bool:
        if self._reference is not None:
            rise, noise = _rise(window, self._reference)
            if rise > self.HEADROOM and rise - 1 > self.Z * noise:
                self._slow = False
                if self._doubled:  # the reference was not queued: it is the first base
                    self._base = _averaged(None, self._reference, self.KEEP)
                    self._probed_at = self.limit // 2
                    return self._set(round(self.HEADROOM * self.limit / rise))
                # The first window queued already: the estimate is high, probe deeper.
                return self._probe(round(self.limit / rise), self.EXIT_PROBE)
            if rise >= self.GROW_BELOW:
                # Maybe a queue read low (a window's first replies are its fastest): read
                # once more at this level, then double on; only a clearly flat window joins
                # the reference and shows that it was not queued.
                self._held = not self._held
                return self._set(self.limit * 2 if self.demand and not self._held
                                 else self.limit)
            self._doubled, self._held = True, False
        self._reference = _pooled(self._reference, window, 1.0)
        return self._set(self.limit * 2 if self.demand else self.limit)

    def _probe(self, back: int, depth: float = 0.75) -> bool:
        """Work at `depth` x `back` for a window (after one that drains), then go back."""
        self._probe_back = max(1, min(self.most, back))
        return self._set(max(1, int(self._probe_back * depth)))

    def _set(self, limit: int) -> bool:
        limit = max(1, min(self.most, limit))
        changed = limit != self.limit
        if changed:
            self.epoch += 1
            self._skip = limit < self.limit
            self._sums = [0, 0.0, 0.0, 0.0, 0.0, 0.0]
        self.limit = limit
        self.demand = False
        return changed


def _pooled(old, new, keep: float):
    """Sums of latency, tokens and variance, the older ones weighted by `keep`."""
    if old is None:
        return new
    return (old[0] * keep + new[0], old[1] * keep + new[1], old[2] * keep * keep + new[2])


def _averaged(old, new, keep: float):
    """The base: a moving average of windows' latency per token, each window counting the
    same (a large early window must not outweigh the probes after it); as sums of one token."""
    latency, tokens, spread = new
    ratio, variance = latency / tokens, spread / tokens ** 2
    if old is None:
        return ratio, 1.0, variance
    return keep * old[0] + (1 - keep) * ratio, 1.0, \
        keep * keep * old[2] + (1 - keep) ** 2 * variance


def _rise(window, base) -> tuple[float, float]:
    """The window's latency per token over the base's, and that ratio's standard error."""
    latency, tokens, spread = window
    b_latency, b_tokens, b_spread = base
    per_token = b_latency / b_tokens
    rise = latency / tokens / per_token
    noise = math.sqrt(spread / tokens ** 2 + b_spread / b_tokens ** 2) / per_token
    return rise, noise
