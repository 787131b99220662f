"""DIR/similarities.sqlite: every WIM similarity of a run, computed once (docs/design.md,
"Scoring and pairs"). A pass's vectors are dropped when it finishes (1.5 KB a text, a
similarity 8 B).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import numpy as np

_CHUNK = 500  # keys per SELECT (well under SQLite's limit on bound variables)


def pair_key(identity: str, response: str, critique: str) -> bytes:
    """The key of one similarity: sha256 of the embedder's identity and both texts."""
    return hashlib.sha256(json.dumps([identity, response, critique]).encode()).digest()


def text_key(identity: str, text: str) -> bytes:
    return hashlib.sha256(json.dumps([identity, text]).encode()).digest()


class SimilarityStore:
    """The run's similarities (and, during a pass, vectors) in one SQLite file."""

    def __init__(self, path: str | Path) -> None:
        self._db = sqlite3.connect(path)
        self._db.executescript(
            "CREATE TABLE IF NOT EXISTS similarity (key BLOB PRIMARY KEY, value REAL NOT NULL)"
            " WITHOUT ROWID;"
            "CREATE TABLE IF NOT EXISTS vector (key BLOB PRIMARY KEY, value BLOB NOT NULL)"
            " WITHOUT ROWID;"
        )

    def similarities(self, keys: Iterable[bytes]) -> dict[bytes, float]:
        return dict(self._select("similarity", keys))

    def vectors(self, keys: Iterable[bytes]) -> dict[bytes, np.ndarray]:
        return {k: np.frombuffer(v, dtype=np.float32) for k, v in self._select("vector", keys)}

    def add(self, similarities: dict[bytes, float], vectors: dict[bytes, np.ndarray]) -> None:
        """Store one batch's new values, all or nothing."""
        with self._db:
            self._db.executemany("INSERT OR IGNORE INTO similarity VALUES (?, ?)",
                                 similarities.items())
            self._db.executemany(
                "INSERT OR IGNORE INTO vector VALUES (?, ?)",
                ((k, np.ascontiguousarray(v, dtype=np.float32).tobytes())
                 for k, v in vectors.items()))

    def drop_vectors(self) -> None:
        """After a finished pass: the similarities stay, the vectors go."""
        with self._db:
            had = self._db.execute("SELECT 1 FROM vector LIMIT 1").fetchone()
            self._db.execute("DELETE FROM vector")
        if had:
            self._db.execute("VACUUM")

    def close(self) -> None:
        self._db.close()

    def _select(self, table: str, keys: Iterable[bytes]):
        keys = list(dict.fromkeys(keys))
        for i in range(0, len(keys), _CHUNK):
            chunk = keys[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            yield from self._db.execute(f"SELECT key, value FROM {table} WHERE key IN ({marks})",
                                        chunk)
