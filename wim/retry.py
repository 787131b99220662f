"""Ask, parse, ask again: the one retry loop of the judge (wim/judges.py), the blind evaluator
(wim/blind.py) and the loop evaluator (wim/refine/evaluator.py), and the seed of each attempt.

Contract:
- Attempt `a` (0 first) asks with the seed `attempt_seed(seed, a)`; batch ingestion
  (data_gen/judge_batch.py) knows a request's attempt from its seed by the same function.
- The first attempt asks at `first_temperature` (greedy for the judges), every retry at
  `retry_temperature`: greedy would repeat itself, so a retry samples with a new seed.
- Only the items the caller's `settle` says to ask again are asked again, in their order; what
  is final (a backend failure, which has the backend's own retries; a reply that spent its
  budget, which the same budget would spend again) is the caller's call, as are the counts it
  keeps (echoes, tokens, `Usage`).
- At most `1 + max_retries` attempts; nothing is asked once nothing is left to ask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Reply = TypeVar("Reply")


def attempt_seed(seed: int, attempt: int) -> int:
    """The seed of attempt `attempt` (0: the first) of a request first asked with `seed`."""
    return seed + 7919 * attempt


def ask_until_parsed(count: int, ask: Callable[[list[int], float, int], Sequence[Reply]],
                     settle: Callable[[int, Reply, int], bool], *, seed: int, max_retries: int,
                     retry_temperature: float, first_temperature: float = 0.0) -> list[int]:
    """Items 0..count-1: `ask(items, temperature, seed)` gives one reply per item, in order;
    `settle(item, reply, attempt)` records it and says whether to ask that item again. Returns
    the items still to ask again after the last attempt (failed, in their order)."""
    todo = list(range(count))
    for attempt in range(max_retries + 1):
        if not todo:
            break
        temperature = first_temperature if attempt == 0 else retry_temperature
        replies = ask(todo, temperature, attempt_seed(seed, attempt))
        todo = [i for i, reply in zip(todo, replies, strict=True) if settle(i, reply, attempt)]
    return todo
