"""A reasoning model's thinking kept apart from its answer, so that only the answer is read as a
critique, rating or verdict (the judges and the blind evaluator call `apart` on every reply).

Contract:
- The thinking is a server's `reasoning` / `reasoning_content` field (`Completion.reasoning`,
  wim/backends/http_backend.py), and the text up to the last `</think>`, with or without the
  opening `<think>` (R1-style chat templates put the opening tag in the prompt). A text that
  opens `<think>` and never closes it is all thinking: no answer.
- A reply whose answer is empty and that the budget cut (`finish_reason: "length"`) ran out of
  tokens (`budget_exhausted`): it is no verdict and no server failure, and asking again with
  the same budget would end the same way.
- Not detected: an R1-style reply (no opening tag) cut inside its thinking before any
  `</think>` reads as an answer; the server does not say where the thinking stopped.
"""

from __future__ import annotations

import dataclasses

from wim.backends import Completion
from wim.backends.base import Usage

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(thinking, or None when the text has none; the answer after it)."""
    end = text.rfind(THINK_CLOSE)
    if end >= 0:
        thought, answer = text[:end], text[end + len(THINK_CLOSE):]
    elif text.lstrip().startswith(THINK_OPEN):
        thought, answer = text, ""  # never closed: cut inside the thinking
    else:
        return None, text
    start = thought.find(THINK_OPEN)
    if start >= 0 and not thought[:start].strip():
        thought = thought[start + len(THINK_OPEN):]
    return thought.strip(), answer.lstrip()


def apart(completion: Completion) -> Completion:
    """The completion with any `<think>` block of its text moved to `reasoning` (after the
    server's own reasoning field, if it gave both)."""
    thought, answer = split_reasoning(completion.text)
    if thought is None:
        return completion
    reasoning = "\n\n".join(r for r in (completion.reasoning, thought) if r)
    return dataclasses.replace(completion, text=answer, reasoning=reasoning)


def budget_exhausted(completion: Completion) -> bool:
    """True when the budget ended the reply before any answer (see the module docstring)."""
    return completion.ok and completion.finish_reason == "length" and not completion.text.strip()


def exhausted_message(setting: str, limit: int, usage: Usage) -> str:
    """The failure of a `budget_exhausted` reply, from its tokens: names the setting and the
    tokens spent."""
    thinking = f", {usage.reasoning} of them reasoning" if usage.reasoning else ""
    return (f"budget exhausted: no answer within {setting} ({limit}; "
            f"{usage.completion} completion tokens spent{thinking}); raise {setting}")
