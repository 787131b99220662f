"""Inputs longer than the model's context: cut from the middle to fit, or skip.

A prompt whose tokens do not fit in `budget` (the context minus the tokens to generate, or a
configured cap) is, by the rule `truncate`, cut from the middle: the longest head and tail that
fit together are kept, joined by a visible marker, so the instructions at the start and the
question at the end both survive. By the rule `skip`, or when even the marker alone does not
fit, the input is left out. Either way the caller counts it; it never runs as if nothing
happened (a model past its context writes empty or garbled text).
"""

from __future__ import annotations

from collections.abc import Callable

CUT_MARKER = "\n[... cut to fit the context ...]\n"


def cut_middle(text: str, keep: int) -> str:
    """`text` with all but `keep` characters removed from its middle (marked)."""
    if keep >= len(text):
        return text
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + CUT_MARKER + (text[len(text) - tail:] if tail else "")


def fit_text(text: str, budget: int, count: Callable[[str], int]) -> str | None:
    """The longest middle cut of `text` with `count(cut) <= budget` (`text` itself when it
    fits); None when nothing fits. `count` gives the tokens of the whole input built around a
    candidate text; a binary search over kept characters calls it about log2(len) times."""
    if count(text) <= budget:
        return text
    if count(cut_middle(text, 0)) > budget:
        return None
    lo, hi = 0, len(text) - 1  # lo always fits; find the largest kept length that does
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(cut_middle(text, mid)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return cut_middle(text, lo)


def token_budget(context: int | None, new_tokens: int, cap: int | None,
                 margin: int = 0) -> int | None:
    """Prompt tokens allowed: the context less what will be generated (and a margin for
    prefills), at most `cap`; None when neither is known (no check)."""
    limits = [context - new_tokens - margin] if context else []
    if cap:
        limits.append(cap)
    return min(limits) if limits else None


def fit_messages(messages: list[dict], budget: int | None, rule: str,
                 count: Callable[[list[dict]], int]) -> tuple[list[dict] | None, bool]:
    """(messages to send or None to skip, truncated?) for a chat prompt; only the last user
    message is cut."""
    if budget is None or count(messages) <= budget:
        return messages, False
    if rule == "skip":
        return None, False
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last is None:
        return None, False

    def with_text(text: str) -> list[dict]:
        return [*messages[:last], {**messages[last], "content": text}, *messages[last + 1:]]

    fitted = fit_text(messages[last]["content"], budget, lambda t: count(with_text(t)))
    return (None, False) if fitted is None else (with_text(fitted), True)
