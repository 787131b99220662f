"""Sentence embedders for the WIM similarity, with a per-run cache keyed by text hash."""

from __future__ import annotations

import hashlib
import logging

import numpy as np

logger = logging.getLogger(__name__)


class Embedder:
    """A sentence-transformers model that returns unit-length embeddings.

    Texts are embedded in batches and cached by sha256, so a response judged several times
    (or re-scored at another zeta) is embedded once.
    """

    def __init__(self, name: str, batch_size: int = 64) -> None:
        from sentence_transformers import SentenceTransformer

        from wim.models import device_and_dtype, model_load_error, resolve_embedder

        self.name = name
        self.batch_size = batch_size
        try:
            self.model = SentenceTransformer(resolve_embedder(name),
                                             device=device_and_dtype()[0])  # GPU when there is one
        except (OSError, ValueError) as err:
            raise model_load_error(name, err) from None
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._cache}
        if todo:
            vectors = self.model.encode(
                list(todo.values()), batch_size=self.batch_size, normalize_embeddings=True,
                convert_to_numpy=True, show_progress_bar=False,
            )
            self._cache.update(zip(todo.keys(), vectors, strict=True))
        dim = self.model.get_embedding_dimension()
        if not texts:
            return np.zeros((0, dim), dtype=np.float32)
        return np.stack([self._cache[k] for k in keys])
