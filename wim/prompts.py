"""Prompt sets: the bundled 64 prompts, local files, or a `datasets` hub name (rows from
wim/rows.py), as `Prompt`s. Every record is checked: `PromptsError` names the file and the line
or row, so a typo in row 4,000 is found before any model is loaded.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wim.rows import PromptsError, iter_rows

logger = logging.getLogger(__name__)

BUNDLED = "bundled"
_RECORD_HELP = (
    "Each record needs a 'prompt' that is a non-empty string or a list of "
    "{'role': ..., 'content': ...} messages ending with a user message, plus an optional "
    "'id' and 'domain'; fix or remove that record."
)


@dataclass(frozen=True)
class Prompt:
    id: str
    """Stable key, unique within a prompt set (used to resume, shard and join results); without
    an `id` field, the 0-based row index (`"00007"`), so ids are stable across runs."""
    domain: str
    """Topic label for per-domain reports; "" when the source has none."""
    messages: tuple[dict, ...]
    """Chat messages, e.g. `({"role": "user", "content": "..."},)`; the last is the user turn."""

    @property
    def length(self) -> int:
        """Characters of all messages: the order prompts are batched in."""
        return sum(len(m["content"]) for m in self.messages)

    @property
    def text(self) -> str:
        """The last user message content (for display and reports)."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "user"), "")


@dataclass(frozen=True, slots=True)
class PromptRef:
    """What batching needs of a prompt, without its text: a 100k-prompt source is batched from
    these (tens of bytes each), its records read when their batch runs."""

    id: str
    length: int
    """Characters of all messages, as `Prompt.length`."""


def bundled_prompts_path() -> Path:
    """Path of the bundled prompt set: 64 prompts, 8 in each of 8 domains."""
    return Path(__file__).parent / "data" / "prompts.jsonl"


def load_prompts(source: str, split: str = "train", limit: int | None = None) -> list[Prompt]:
    """The first `limit` prompts (all when None) of `source`: `"bundled"`, a file, or a hub name
    read with `split`. A local file is validated in full whatever the limit; a hub dataset is
    cut to `limit` rows first because it may be large."""
    if limit is not None and (isinstance(limit, bool) or limit < 1):
        raise PromptsError(
            f"Prompt limit must be a positive integer or None, got {limit!r} (source {source!r}). "
            "Set prompts.limit to a number of prompts, or remove it to use them all."
        )
    rows, origin = iter_rows(str(bundled_prompts_path()) if source == BUNDLED else source, split,
                             limit)
    prompts = _build_prompts(list(rows), origin)
    if not prompts:
        raise PromptsError(
            f"{origin} contains no prompts. Add records with a 'prompt' field, "
            "or point prompts.source at another file or 'bundled'."
        )
    prompts = prompts[:limit]
    logger.info("Loaded %d prompts from %s", len(prompts), source)
    return prompts


def _build_prompts(rows: Iterable[tuple[str, Any]], origin: str) -> list[Prompt]:
    """Turn (location, record) pairs into prompts and check that ids are unique."""
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for index, (where, record) in enumerate(rows):
        prompt = _to_prompt(record, index, f"{origin}, {where}")
        if prompt.id in seen:
            raise PromptsError(
                f"{origin}: duplicate id {prompt.id!r} at {seen[prompt.id]} and {where}. Ids must "
                "be unique because results are keyed by them; rename one or drop the 'id' field "
                "everywhere to number the prompts by row."
            )
        seen[prompt.id] = where
        prompts.append(prompt)
    return prompts


def _to_prompt(record: Any, index: int, where: str) -> Prompt:
    """Validate one record; `where` names the file and line or row for errors."""
    if not isinstance(record, dict):
        raise PromptsError(
            f"{where}: expected a JSON object, got {type(record).__name__}. {_RECORD_HELP}"
        )
    if _is_missing(record.get("prompt")):
        raise PromptsError(f"{where}: missing 'prompt'. {_RECORD_HELP}")
    messages = _to_messages(record["prompt"], where)
    raw_id = record.get("id")
    if not (_is_missing(raw_id) or isinstance(raw_id, str)
            or isinstance(raw_id, numbers.Integral) and not isinstance(raw_id, bool)):
        raise PromptsError(
            f"{where}: 'id' must be a string or an integer, got {raw_id!r}. {_RECORD_HELP}"
        )
    prompt_id = f"{index:05d}" if _is_missing(raw_id) or raw_id == "" else str(raw_id)
    domain = record.get("domain")
    if _is_missing(domain):
        domain = ""
    elif not isinstance(domain, str):
        raise PromptsError(f"{where}: 'domain' must be a string, got {domain!r}. {_RECORD_HELP}")
    return Prompt(id=prompt_id, domain=domain, messages=messages)


def _to_messages(value: Any, where: str) -> tuple[dict, ...]:
    """A string becomes one user message; a list of messages is checked and copied."""
    if isinstance(value, str):
        if not value.strip():
            raise PromptsError(f"{where}: empty prompt. {_RECORD_HELP}")
        return ({"role": "user", "content": value},)
    if hasattr(value, "tolist"):  # parquet list columns arrive as numpy arrays
        value = value.tolist()
    if not isinstance(value, list):
        raise PromptsError(
            f"{where}: 'prompt' is a {type(value).__name__}, not a string or a list of messages. "
            f"{_RECORD_HELP}"
        )
    if not value:
        raise PromptsError(f"{where}: empty prompt (an empty message list). {_RECORD_HELP}")
    messages = []
    for number, message in enumerate(value, start=1):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and message["role"]
            and isinstance(message.get("content"), str)
        ):
            raise PromptsError(
                f"{where}: prompt message {number} is not a {{'role': str, 'content': str}} "
                f"object (got {message!r}). {_RECORD_HELP}"
            )
        messages.append({"role": message["role"], "content": message["content"]})
    # The policy answers the conversation, so it must end on the user's turn.
    if messages[-1]["role"] != "user":
        raise PromptsError(
            f"{where}: the last prompt message has role {messages[-1]['role']!r}, expected 'user'. "
            f"{_RECORD_HELP}"
        )
    if not messages[-1]["content"].strip():
        raise PromptsError(
            f"{where}: empty prompt (the last user message is blank). {_RECORD_HELP}"
        )
    return tuple(messages)


def _is_missing(value: Any) -> bool:
    """None, or the NaN pandas uses for an empty parquet cell."""
    return value is None or (isinstance(value, float) and math.isnan(value))
