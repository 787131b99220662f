"""Work that flows: calls to a backend kept in flight across batch boundaries.

A server with continuous batching (vLLM, SGLang) idles while a stage waits for the slowest
request of a batch, so the stages run several batches at once and still take their results in
batch order (records are written in a deterministic order; resume and shards stay exact).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], window: int) -> Iterator[tuple[T, R]]:
    """(item, fn(item)) for each item in order, up to `window` calls at once in threads, items
    read lazily (at most `window` ahead); window <= 1 runs every call in the caller's thread."""
    if window <= 1:
        for item in items:
            yield item, fn(item)
        return
    pending: deque = deque()
    with ThreadPoolExecutor(window, thread_name_prefix="wim-flow") as pool:
        for item in items:
            pending.append((item, pool.submit(fn, item)))
            if len(pending) >= window:
                item0, future = pending.popleft()
                yield item0, future.result()
        while pending:
            item0, future = pending.popleft()
            yield item0, future.result()


def batch_window(max_in_flight: int, requests_per_batch: int) -> int:
    """How many batches to run at once so that `max_in_flight` requests stay busy. Results are
    taken in order, so a batch whose slowest request lags holds its place in the window while
    the batches after it finish; request times have a long tail, so the window holds about 5
    slots' worth of batches, not 1 (a simulated 64-slot server with lognormal request times:
    tests/benchmarks/bench_scale.py, results/scale.txt)."""
    if max_in_flight <= 1:
        return 1
    return 2 + 5 * -(-max_in_flight // max(1, requests_per_batch))
