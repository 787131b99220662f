"""Keyed JSONL files: appended record by record, resumable after a crash.

A process killed mid-write leaves at most one torn last line. Readers ignore it and
`open_for_append` cuts it off before writing, so a resumed stage neither loses nor
duplicates a record. A malformed line anywhere else is real corruption and an error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from wim.errors import WimError

Key = tuple[str, int]


class RecordsError(WimError):
    """A run's JSONL file is corrupt or holds a record that does not fit the contract."""


def record_key(record: dict[str, Any]) -> Key:
    return (str(record["prompt_id"]), int(record["sample_idx"]))


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a JSONL file ([] if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with path.open("rb") as f:
        lines = f.read().split(b"\n")
    # The part after the last newline is empty, or a torn write that never finished.
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise RecordsError(
                f"{path}, line {number}: not valid JSON ({err.msg}). The file is corrupt; "
                "delete it (or the run directory) to rebuild this stage."
            ) from None
    return records


def _cut_torn_tail(path: Path) -> None:
    with path.open("rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            f.truncate(end)


class JsonlAppender:
    """Append records and flush each one, so a kill loses at most the line being written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists():
            _cut_torn_tail(self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def write_all(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            self.write(record)
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_records_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace a whole file at once (derived stages such as scores and pairs)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def index_by_key(records: Iterable[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    return {record_key(r): r for r in records}
