"""DIR/similarities.sqlite: every WIM similarity of a run, computed once.

A similarity depends on the embedder (backend, model, dtype: its `identity`), the response and
the critique, and on nothing else, so it is stored under the sha256 of those three and reused
by every re-score at another zeta, every `wim compare` arm and every resumed or repeated run;
stored values are never recomputed, so a re-score gives them back bit for bit. Another
embedder or dtype has other keys: its values never mix with stored ones.

While a scoring pass runs, the vectors of the texts it embedded are kept too (table `vector`,
keyed by identity and text), so a text that appears again later in the run is not embedded
again, and a pass resumed after a kill sends the embedder exactly the texts the uninterrupted
pass would have sent (a batch's vectors depend on what is embedded with it). Each batch's
similarities and vectors are committed in one transaction; a finished pass drops the vectors,
which are 1.5 KB a text where a similarity is 8 bytes.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import numpy as np

STORE = "similarities.sqlite"
_CHUNK = 500  # keys per SELECT (well under SQLite's limit on bound variables)


def pair_key(identity: str, response: str, critique: str) -> bytes:
    """The key of one similarity: sha256 of the embedder's identity and both texts."""
    return hashlib.sha256(json.dumps([identity, response, critique]).encode()).digest()


def text_key(identity: str, text: str) -> bytes:
    return hashlib.sha256(json.dumps([identity, text]).encode()).digest()


class SimilarityStore:
    """The run's similarities (and, during a pass, vectors) in one SQLite file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path)
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

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM similarity").fetchone()[0]

    def close(self) -> None:
        self._db.close()

    def _select(self, table: str, keys: Iterable[bytes]):
        keys = list(dict.fromkeys(keys))
        for i in range(0, len(keys), _CHUNK):
            chunk = keys[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            yield from self._db.execute(f"SELECT key, value FROM {table} WHERE key IN ({marks})",
                                        chunk)
