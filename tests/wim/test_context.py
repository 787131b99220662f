"""Inputs longer than the context: cut from the middle or skipped (wim/context.py)."""

from __future__ import annotations

from wim.backends.transformers_backend import length_groups
from wim.context import CUT_MARKER, cut_middle, fit_messages, fit_text, token_budget


def words(text: str) -> int:
    return len(text.split())


def test_fit_text_keeps_the_longest_head_and_tail_that_fit() -> None:
    text = " ".join(f"w{i}" for i in range(1000))
    fitted = fit_text(text, 50, words)
    assert words(fitted) <= 50 and CUT_MARKER in fitted
    head, tail = fitted.split(CUT_MARKER)
    assert text.startswith(head) and text.endswith(tail)
    assert head.startswith("w0 w1") and tail.endswith("w998 w999")
    # The longest: one more kept character would not fit.
    keep = len(head) + len(tail)
    assert words(cut_middle(text, keep + 1)) > 50 or words(cut_middle(text, keep + 2)) > 50


def test_fit_text_leaves_short_text_alone_and_gives_up_when_nothing_fits() -> None:
    assert fit_text("a b c", 3, words) == "a b c"
    assert fit_text("a b c d", 3, lambda t: words(t) + 10) is None


def test_fit_messages_rules() -> None:
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "x " * 500}]

    def count(msgs: list[dict]) -> int:
        return sum(words(m["content"]) for m in msgs)

    assert fit_messages(messages, None, "truncate", count) == (messages, False)
    assert fit_messages(messages, 1000, "truncate", count) == (messages, False)
    assert fit_messages(messages, 40, "skip", count) == (None, False)
    fitted, truncated = fit_messages(messages, 40, "truncate", count)
    assert truncated and fitted[0] == messages[0] and count(fitted) <= 40
    assert fit_messages(messages, 2, "truncate", count) == (None, False)  # the system alone


def test_token_budget() -> None:
    assert token_budget(8192, 64, None) == 8128
    assert token_budget(8192, 64, 256) == 256
    assert token_budget(None, 64, 256) == 256
    assert token_budget(None, 64, None) is None
    assert token_budget(2048, 48, None, margin=8) == 1992


def test_an_outlier_is_batched_alone() -> None:
    assert length_groups([30, 31, 35, 40, 8000], 8) == [(0, 4), (4, 5)]
    assert length_groups([10, 11, 12, 13, 14], 2) == [(0, 2), (2, 4), (4, 5)]
    assert length_groups([], 4) == []
