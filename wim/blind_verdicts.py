"""What one blind verdict is, and how it is read: both orders of a pair combined, and the
weighted preference from the verdict token's probabilities (docs/design.md, "Blind outcome
evaluation": where they come from)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class PairVerdict:
    """One question with answers a and b, judged in both orders."""

    winner: str | None
    """"a", "b" or "tie" (orders that disagree count as a tie); None: failed after retries."""
    failure: str | None
    """Why it failed (never counted as a win for either side); None when it did not."""
    raw: list[str]
    """The evaluator's raw texts (order a/b first, then b/a), for audit."""
    tokens: int = 0
    """Evaluator tokens spent on both orders (prompt + completion, all attempts)."""
    orders: tuple[str | None, str | None] = (None, None)
    """Each order's own verdict in terms of a and b ("a", "b", "tie"; None: that order failed):
    order a/b first, then b/a. Kept for the position-bias check (order agreement)."""
    identical: bool = False
    """The two answers were the same text: a tie without asking."""
    probs: tuple[dict | None, dict | None] = (None, None)
    """Each order's probabilities of its verdicts {"A", "B", "tie"} (as shown in that order:
    in order b/a, "A" is answer b); None: no probabilities (hard verdict, or failed)."""
    path: str = "top_logprobs"
    """Where `probs` came from: `guided` (the transformers backend's guided step) or
    `top_logprobs` (a server's, or llama.cpp's)."""

    @property
    def sources(self) -> tuple[str, str] | None:
        """Per order where its preference came from: `path` or `hard` (no probabilities);
        both `identical` for identical answers; None when the verdict failed."""
        if self.identical:
            return ("identical", "identical")
        if self.winner is None:
            return None
        return tuple(self.path if p else "hard" for p in self.probs)  # type: ignore

    @property
    def order_preferences(self) -> tuple[float, float] | None:
        """P(a better) in order a/b and in order b/a (a tie's mass split in half); a hard
        verdict counts as probability 1. None when the verdict failed."""
        if self.identical:
            return (0.5, 0.5)
        if self.winner is None:
            return None
        out = []
        for shown_a, probs, order in zip(("A", "B"), self.probs, self.orders, strict=True):
            if probs is None:
                probs = {{"a": shown_a, "b": "B" if shown_a == "A" else "A"}.get(order, "tie"):
                         1.0}
            out.append(probs.get(shown_a, 0.0) + 0.5 * probs.get("tie", 0.0))
        return (out[0], out[1])

    @property
    def preference(self) -> float | None:
        """p = (P_ab(a better) + P_ba(a better)) / 2; None when the verdict failed."""
        both = self.order_preferences
        # Rounded: a pure position bias cancels exactly, not to 1e-17 (a t-test would read
        # rounding noise as a spread).
        return None if both is None else round((both[0] + both[1]) / 2, 10)

    @property
    def tie_kind(self) -> str | None:
        """For a tie: `identical`, `real` (both orders said tie) or `order_disagreement`."""
        if self.winner != "tie":
            return None
        if self.identical:
            return "identical"
        return "real" if self.orders == ("tie", "tie") else "order_disagreement"


@dataclass
class PointVerdict:
    score: float | None
    """In [0, 1] ((N - 1) / 9 of a 1-10 score); None: failed after retries."""
    failure: str | None
    raw: list[str]
    tokens: int
    """Evaluator tokens spent (prompt + completion, all attempts)."""


def _choice_of(token: str) -> str | None:
    """The verdict a token starts: "A" or "B" (capitals), "tie" for any non-empty prefix of it
    ("t", "ti", "tie"); spaces and JSON quotes around it do not count. None for other tokens."""
    core = token.strip().strip('"').strip()
    if core in ("A", "B"):
        return core
    if core and "tie".startswith(core.lower()):
        return "tie"
    return None


_MASKED = -50.0
"""A listed token at or below this logprob was masked by guided decoding (vLLM lists masked
tokens at -9999): it does not make a position a verdict position."""


def verdict_probabilities(top_logprobs, verdict: str | None) -> dict[str, float] | None:
    """{"A", "B", "tie"} -> probability at the verdict position, normalized over the three
    (each sums every listed token that starts it: "t", "ti", "tie"; " C" is left out); None
    when there is none. That is the last generated position (the verdict comes last) that lists
    two choices unmasked (a sampled retry's verdict need not be the most likely), or whose most
    likely token starts the parsed `verdict` (a peaked distribution)."""
    if verdict is None:
        return None
    for position in reversed(top_logprobs or ()):
        if not position:
            continue
        best = max(position, key=position.get)
        listed = {_choice_of(t) for t, lp in position.items() if lp > _MASKED} - {None}
        if len(listed) < 2 and _choice_of(best) != verdict:
            continue
        mass = {"A": 0.0, "B": 0.0, "tie": 0.0}
        for token, logprob in position.items():
            choice = _choice_of(token)
            if choice is not None and math.isfinite(logprob):
                mass[choice] += math.exp(logprob)
        total = sum(mass.values())
        return {k: v / total for k, v in mass.items()} if total > 0 else None
    return None


def verdict_schema(max_new_tokens: int) -> dict:
    """The JSON a server is asked for in weighted mode: a bounded reason, then the verdict as an
    enum, so guided decoding restricts it to the three choices (its `top_logprobs` too)."""
    from wim.judge_prompts import critique_max_chars

    return {"type": "object",
            "properties": {"reason": {"type": "string",
                                      "maxLength": critique_max_chars(max_new_tokens)},
                           "verdict": {"type": "string", "enum": ["A", "B", "tie"]}},
            "required": ["reason", "verdict"], "additionalProperties": False}


def order_verdicts(first: str | None, second: str | None) -> tuple[str | None, str | None]:
    """Verdict `first` (a shown as A) and `second` (b shown as A) in terms of a and b."""
    return ({"A": "a", "B": "b", "tie": "tie"}.get(first),  # type: ignore[arg-type]
            {"A": "b", "B": "a", "tie": "tie"}.get(second))  # type: ignore[arg-type]


def combine_orders(first: str, second: str) -> str:
    """The winner from verdict `first` (a shown as A) and `second` (b shown as A): a winner
    only when both orders name the same answer; disagreement or any tie is a tie."""
    a_first, a_second = order_verdicts(first, second)
    return a_first if a_first == a_second else "tie"
