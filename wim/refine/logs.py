"""The logs `wim vrr calibrate` reads: verifier votes and labelled repairs, one JSON object per
line (wim/refine/vrr.py estimates the noise from them)."""

from __future__ import annotations

from pathlib import Path

from wim.errors import InputError
from wim.records import read_input_jsonl


def _jsonl(path: Path, label: str):
    if not path.is_file():
        raise InputError(f"{path}: no such file.")
    for n, row in read_input_jsonl(path, label, InputError):
        if not isinstance(row, dict):
            raise InputError(f"{path}:{n}: expected a JSON object per line.")
        yield n, row


def read_votes(path: Path, m: int | None) -> tuple[list[int], int]:
    """Each line: {"votes": [1, 0, ...]} (1 = accept) or {"accepts": S, "m": M}; one M for all."""
    accepts, ms = [], set()
    for n, row in _jsonl(path, "Votes"):
        votes = row.get("votes")
        if isinstance(votes, list) and all(v in (0, 1) for v in votes):  # True, False included
            s, mm = int(sum(votes)), len(votes)
        elif isinstance(row.get("accepts"), int) and isinstance(row.get("m", m), int):
            s, mm = row["accepts"], row.get("m", m)
            if not 0 <= s <= mm:
                raise InputError(f"{path}:{n}: 'accepts' must lie in 0..{mm}, got {s}.")
        else:
            raise InputError(f"{path}:{n}: expected 'votes' (a list of 0/1) or 'accepts' (an "
                             f"integer, with 'm' on the line or --m), got keys {sorted(row)}.")
        accepts.append(s)
        ms.add(mm)
    if not accepts:
        raise InputError(f"{path}: holds no votes.")
    if len(ms) != 1:
        raise InputError(f"{path}: every plan needs the same number of votes, got {sorted(ms)}.")
    return accepts, ms.pop()


def read_repairs(path: Path) -> tuple[list[bool], list[bool]]:
    """Each line: {"valid_before": true|false, "valid_after": true|false}."""
    before, after = [], []
    for n, row in _jsonl(path, "Repairs"):
        a, b = row.get("valid_before"), row.get("valid_after")
        if not isinstance(a, bool) or not isinstance(b, bool):
            raise InputError(f"{path}:{n}: expected booleans 'valid_before' and 'valid_after', "
                             f"got {a!r} and {b!r}.")
        before.append(a)
        after.append(b)
    if not before:
        raise InputError(f"{path}: holds no labelled repairs.")
    return before, after
