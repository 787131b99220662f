"""Keyed JSONL files: appended record by record, resumable after a crash.

A process killed mid-write (or a disk that fills up mid-line) leaves at most one torn last
line. Readers ignore it and `JsonlAppender` cuts it off before writing, so a resumed stage
neither loses nor duplicates a record. A malformed line anywhere else is real corruption and an
error, and so is a key that appears twice (`read_keyed`): we refuse such a file rather than
guess which copy is right.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from array import array
from collections.abc import Iterable, Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

from wim.errors import WimError

Key = tuple[str, int]


class RecordsError(WimError):
    """A run's JSONL file is corrupt or holds a record that does not fit the contract."""


class StorageError(RecordsError):
    """The file system refused a write: disk full, no permission, read-only, ..."""


_STORAGE_HINTS = {
    errno.ENOSPC: ("the disk is full", "free some space (or choose another --out folder)"),
    errno.EDQUOT: ("the disk quota is exceeded", "free some space (or choose another --out)"),
    errno.EACCES: ("permission denied", "choose a folder you can write, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "choose a folder you can write"),
    errno.EROFS: ("the file system is read-only", "choose a writable folder for --out"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "choose another --out path"),
    errno.EISDIR: ("a folder stands where a file should be", "move that folder away"),
}
STORAGE_ERRNOS = frozenset(_STORAGE_HINTS)


def storage_error(err: OSError, path: str | Path | None = None) -> StorageError:
    """One paragraph for a failed write: what happened, where, what to do."""
    what, todo = _STORAGE_HINTS.get(err.errno, (err.strerror or str(err), "check the folder"))
    where = path or err.filename or "the run directory"
    return StorageError(
        f"cannot write {where}: {what} ({errno.errorcode.get(err.errno, err.errno)}). "
        f"Records already written are kept; {todo}, then run the same command again to go on "
        "where it stopped."
    )


def record_key(record: dict[str, Any]) -> Key:
    return (str(record["prompt_id"]), int(record["sample_idx"]))


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a JSONL file ([] if it does not exist)."""
    return [record for _, record in iter_records(path)]


def _checked_key(record: dict[str, Any], path: str | Path, number: int,
                 nonnegative: bool = False) -> Key:
    """The record's key; RecordsError when it has none (or a negative one, if `nonnegative`)."""
    try:
        key = record_key(record)
        if nonnegative and key[1] < 0:
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise RecordsError(
            f"{path}, record {number}: no valid prompt_id/sample_idx key. The file was not "
            "written by wim; delete it (or the run directory) to rebuild this stage."
        ) from None
    return key


def read_keyed(path: str | Path) -> list[dict[str, Any]]:
    """`read_records` for a keyed stage file; raise RecordsError if a key appears twice."""
    records = read_records(path)
    first: dict[Key, int] = {}
    for number, record in enumerate(records, start=1):
        key = _checked_key(record, path, number)
        if key in first:
            dupes = len(records) - len({record_key(r) for r in records})
            raise RecordsError(
                f"{path}: key (prompt_id={key[0]!r}, sample_idx={key[1]}) appears twice (records "
                f"{first[key]} and {number}; {dupes} repeated record(s) in all), so the file was "
                "written twice, e.g. by two processes at once. Keep one line per key (or delete "
                "the file to rebuild this stage) and run the command again."
            )
        first[key] = number
    return records


def iter_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(byte offset, record) of each complete line, streamed ([] if no file)."""
    path = Path(path)
    if not path.exists():
        return
    with path.open("rb") as f:
        offset = 0
        for number, line in enumerate(f, start=1):
            start, offset = offset, offset + len(line)
            if not line.endswith(b"\n"):
                return  # a torn write that never finished
            if not line.strip():
                continue
            try:
                yield start, json.loads(line)
            except json.JSONDecodeError as err:
                raise RecordsError(
                    f"{path}, line {number}: not valid JSON ({err.msg}). The file is corrupt; "
                    "delete it (or the run directory) to rebuild this stage."
                ) from None


class KeySet:
    """The (prompt_id, sample_idx) keys of a stage file, held as one bit mask per prompt: a
    set of 400,000 key tuples would take ~60 MB, this a tenth of it."""

    def __init__(self) -> None:
        self._bits: dict[str, int] = {}
        self.count = 0

    def add(self, key: Key) -> bool:
        """Add a key; False when it was already there."""
        bits = self._bits.get(key[0], 0)
        bit = 1 << key[1]
        if bits & bit:
            return False
        self._bits[key[0]] = bits | bit
        self.count += 1
        return True

    def __contains__(self, key: Key) -> bool:
        return bool(self._bits.get(key[0], 0) >> key[1] & 1)

    def __len__(self) -> int:
        return self.count


def iter_keyed(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """`read_keyed` as a stream of `iter_records`, without holding the records."""
    seen = KeySet()
    for number, (offset, record) in enumerate(iter_records(path), start=1):
        key = _checked_key(record, path, number, nonnegative=True)  # for KeySet
        if not seen.add(key):
            raise RecordsError(
                f"{path}: key (prompt_id={key[0]!r}, sample_idx={key[1]}) appears twice (again "
                f"at record {number}), so the file was written twice, e.g. by two processes at "
                "once. Keep one line per key (or delete the file to rebuild this stage) and run "
                "the command again."
            )
        yield offset, record


def read_keys(path: str | Path) -> KeySet:
    """The keys of a keyed stage file, checked as `iter_keyed` does."""
    keys = KeySet()
    for _, record in iter_keyed(path):
        keys.add(record_key(record))
    return keys


class RecordIndex:
    """Where each prompt's records are in a keyed JSONL file ({prompt_id: [sample_idx, offset,
    ...]}), so a stage holds offsets, not records. A prompt's records need not be next to each
    other: a resumed run appends the rest later."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._where: dict[str, array] = {}
        self.count = 0
        for offset, record in iter_keyed(self.path):
            pid, idx = record_key(record)
            self._where.setdefault(pid, array("q")).extend((idx, offset))
            self.count += 1

    def __len__(self) -> int:
        return self.count

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self._where

    def prompt_ids(self) -> list[str]:
        return list(self._where)

    def sample_count(self, prompt_id: str) -> int:
        return len(self._where.get(prompt_id, ())) // 2

    def sample_indices(self, prompt_id: str) -> list[int]:
        return sorted(self._where.get(prompt_id, array("q"))[::2])

    def read(self, prompt_ids: Iterable[str]) -> list[dict[str, Any]]:
        """The records of these prompts, prompt by prompt, each prompt's by sample_idx."""
        out: list[dict[str, Any]] = []
        with self.path.open("rb") as f:
            for pid in prompt_ids:
                where = self._where.get(pid, ())
                for _idx, offset in sorted(zip(where[::2], where[1::2], strict=True)):
                    f.seek(offset)
                    out.append(json.loads(f.readline()))
        return out

    def groups(self, batch: int = 256) -> Iterator[list[dict[str, Any]]]:
        """Each prompt's records (by sample_idx), prompts in the order of their first record."""
        ids = self.prompt_ids()
        for start in range(0, len(ids), batch):
            records = self.read(ids[start:start + batch])
            for _, group in groupby(records, key=lambda record: str(record["prompt_id"])):
                yield list(group)


def _cut_torn_tail(path: Path) -> None:
    """Cut what follows the last newline, reading only the file's tail."""
    with path.open("rb+") as f:
        size = pos = f.seek(0, os.SEEK_END)
        end = 0
        while pos > 0:
            step = min(1 << 16, pos)
            pos = f.seek(pos - step)
            at = f.read(step).rfind(b"\n")
            if at >= 0:
                end = pos + at + 1
                break
        if end != size:
            f.truncate(end)


class JsonlAppender(contextlib.AbstractContextManager):
    """Append records and flush each one, so a kill loses at most the line being written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            if self.path.exists():
                _cut_torn_tail(self.path)
            # Unbuffered bytes: a failed write leaves nothing pending that a later close would
            # try to write again, and at most one torn line that the next run cuts off.
            self._file = self.path.open("ab", buffering=0)
        except OSError as err:
            raise storage_error(err, self.path) from None

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            view = memoryview(line)
            while view:  # a raw write may be partial
                view = view[self._file.write(view):]
        except OSError as err:
            raise storage_error(err, self.path) from None

    def write_all(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            self.write(record)
        try:
            os.fsync(self._file.fileno())
        except OSError as err:
            raise storage_error(err, self.path) from None

    def close(self) -> None:
        self._file.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_records_atomic(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace a whole file at once (derived stages such as scores and pairs)."""
    write_atomic(path, (json.dumps(record, ensure_ascii=False) + "\n" for record in records))


def write_atomic(path: str | Path, chunks: Iterable[str] | bytes) -> None:
    """Replace a whole file with the text `chunks` (or bytes), or leave it as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            if isinstance(chunks, bytes):
                f.write(chunks)
            else:
                f.writelines(chunk.encode("utf-8") for chunk in chunks)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)  # the old file, if any, is untouched
        raise storage_error(err, path) from None


def read_input_jsonl(path: str | Path, label: str, error: type[WimError] = WimError
                     ) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSONL file a user wrote, streamed.
    Unlike a stage file's, every line counts: one that is not UTF-8 JSON raises `error`."""
    path = Path(path)
    try:
        f = path.open(encoding="utf-8-sig")
    except OSError as e:
        raise error(f"{label} file {str(path)!r} could not be read ({one_line(e)}).") from e
    number = 0
    with f:
        try:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    hint = (" (this file looks like a JSON array; write one object per line)"
                            if line.lstrip().startswith("[") else "")
                    raise error(
                        f"{label} file {str(path)!r}, line {number}: invalid JSON ({e.msg} at "
                        f"column {e.colno}). Each non-blank line must be one JSON object{hint}; "
                        "fix that line or remove it."
                    ) from e
                yield number, value
        except UnicodeDecodeError as e:  # raised by the read of line number + 1
            raise error(
                f"{label} file {str(path)!r}, line {number + 1}: not UTF-8 text "
                f"({one_line(e)}). Save it as UTF-8 JSON lines, one object per line."
            ) from e


def one_line(error: BaseException) -> str:
    """The first line of an exception message, so errors stay one paragraph."""
    text = str(error).strip()
    # Trailing periods are dropped because the message adds its own punctuation.
    return text.splitlines()[0].rstrip(".") if text else type(error).__name__
