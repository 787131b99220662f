"""Work that flows: calls to a backend kept in flight across batch boundaries, since a server
with continuous batching (vLLM, SGLang) idles while a stage waits for a batch's slowest request
(docs/design.md, "The run directory").
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
    """Batches at once to keep `max_in_flight` requests busy: about 5 slots' worth, not 1, since
    results are taken in order and a lagging batch holds its place (lognormal request times on a
    simulated 64-slot server: tests/benchmarks/bench_scale.py, results/scale.txt)."""
    if max_in_flight <= 1:
        return 1
    return 2 + 5 * -(-max_in_flight // max(1, requests_per_batch))
