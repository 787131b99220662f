"""Sentence embedders for the WIM similarity: in process (sentence-transformers) or on an
OpenAI-compatible `/v1/embeddings` server (vLLM `--runner pooling`, TEI, OpenAI).

Both return unit-length float32 vectors, one row per text, and carry an `identity`: the string
that names what computed the vectors (backend, model, dtype). The score stage keys every
stored similarity by it, so vectors of another embedder or dtype never mix with stored ones.
`open_embedder` builds either from the config: the one place that does.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import numpy as np

from wim.errors import WimError

logger = logging.getLogger(__name__)


class EmbedderError(WimError):
    """An embeddings server failed, or answered with vectors that do not fit."""


class Embedder:
    """A sentence-transformers model that returns unit-length embeddings, on the GPU when
    there is one, in `dtype` (wim/precision.py's rule). Texts are cached by sha256 for the
    embedder's lifetime, so a response judged several times (or re-scored at another zeta) in
    one process is embedded once (the score stage keeps no cache: it stores similarities)."""

    def __init__(self, name: str, batch_size: int = 64, dtype: str = "float32") -> None:
        from sentence_transformers import SentenceTransformer

        from wim.models import device_and_dtype, model_load_error, resolve_embedder
        from wim.precision import resolve_dtype

        self.name = name
        self.batch_size = batch_size
        self.dtype = resolve_dtype(dtype)
        device, torch_dtype = device_and_dtype(self.dtype)  # GPU when there is one
        try:
            self.model = SentenceTransformer(resolve_embedder(name), device=device,
                                             model_kwargs={"torch_dtype": torch_dtype})
        except (OSError, ValueError) as err:
            raise model_load_error(name, err) from None
        self._cache: dict[str, np.ndarray] = {}

    @property
    def identity(self) -> str:
        return embedder_identity("sentence_transformers", self.name, self.dtype)

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._cache}
        if todo:
            vectors = self.model.encode(
                list(todo.values()), batch_size=self.batch_size, normalize_embeddings=True,
                convert_to_numpy=True, show_progress_bar=False,
            ).astype(np.float32, copy=False)  # bfloat16 comes back as float32 (numpy has none)
            self._cache.update(zip(todo.keys(), vectors, strict=True))
        if not texts:
            return np.zeros((0, self.model.get_embedding_dimension()), dtype=np.float32)
        return np.stack([self._cache[k] for k in keys])

    def forget(self) -> None:
        """Drop the cache (the score stage embeds batch by batch with flat memory)."""
        self._cache.clear()

    def close(self) -> None:
        pass


class HTTPEmbedder:
    """Embeddings from OpenAI-compatible `/v1/embeddings` servers, `batch_size` texts a request,
    through the judge's HTTP transport (wim/backends/http_client.py). Vectors are normalized here
    (servers differ on whether they do), so the cosine is a dot product as in process."""

    def __init__(self, model: str, base_urls: list[str], batch_size: int = 64,
                 params: dict | None = None, **settings) -> None:
        from wim.backends.http_client import HTTPClient

        if not base_urls:
            raise EmbedderError("scoring.backend is http but no base URL is set "
                                "(scoring.http.base_urls or http.base_urls)")
        if not model:
            raise EmbedderError("scoring.backend is http but no model name is set "
                                "(scoring.http.model or http.model): the server's name for "
                                "its embedding model")
        self.name = model
        self.batch_size = batch_size
        self.params = dict(params or {})  # scoring.http.params: extra fields of each request
        self.dtype = None  # the server's choice
        self.client = HTTPClient(base_urls, **settings)  # HTTPClient's keyword arguments
        self.dimension: int | None = None
        cap = self.client.concurrency
        cap = self.client.max_concurrency if cap == "auto" else cap
        self.in_flight = max(1, cap // 2)  # batches the score stage sends at once

    @property
    def identity(self) -> str:
        return embedder_identity("http", self.name)

    @property
    def stats(self) -> dict[str, int]:
        return self.client.stats

    def embed(self, texts: list[str]) -> np.ndarray:
        from wim.backends.http_client import Failure

        if not texts:
            return np.zeros((0, self.dimension or 0), dtype=np.float32)
        chunks = [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]
        payloads = [{**self.params, "model": self.name, "input": chunk,
                     "encoding_format": "float"}
                    for chunk in chunks]
        replies = self.client.post_many("/embeddings", payloads, parse=_embeddings_reply)
        parts = []
        for chunk, reply in zip(chunks, replies, strict=True):
            if isinstance(reply, Failure):
                raise EmbedderError(
                    f"the embeddings server failed: {reply.reason}. Scores and similarities "
                    "written so far are kept; when the server is back, run the same command "
                    "again to go on.")
            url, vectors = reply
            if vectors.shape[0] != len(chunk):
                raise EmbedderError(f"{url} answered {vectors.shape[0]} vectors for "
                                    f"{len(chunk)} texts")
            if self.dimension is None:
                self.dimension = vectors.shape[1]
            if vectors.shape[1] != self.dimension:
                raise EmbedderError(f"{url} answered vectors of dimension {vectors.shape[1]}, "
                                    f"the others had {self.dimension}")
            parts.append(vectors)
        out = np.concatenate(parts)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return (out / np.where(norms == 0, 1.0, norms)).astype(np.float32)

    def forget(self) -> None:
        pass

    def close(self) -> None:
        self.client.close()


def _embeddings_reply(status: int, body: bytes, url: str) -> Any:
    """(url, vectors in the order of the inputs) from an OpenAI embeddings reply."""
    from wim.backends.http_client import Failure, parse_json

    data = parse_json(status, body, url)
    if isinstance(data, Failure):
        return data
    try:
        items = sorted(data["data"], key=lambda d: d["index"])
        rows = [d["embedding"] for d in items]
    except (KeyError, TypeError) as err:
        return Failure(f"malformed embeddings reply from {url} ({type(err).__name__}: {err})",
                       retry=True)
    if len({len(r) if isinstance(r, list) else -1 for r in rows}) > 1:
        return Failure(f"{url} answered vectors of different dimensions in one reply")
    try:
        vectors = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
    except (TypeError, ValueError) as err:
        return Failure(f"malformed embeddings reply from {url} ({err})", retry=True)
    return url, vectors


def embedder_identity(backend: str, name: str, dtype: str | None = None) -> str:
    """What computed a vector: `sentence_transformers:<name>:<dtype>` (the dtype resolved) or
    `http:<served model name>` (a server's dtype is its own)."""
    return f"{backend}:{name}:{dtype}" if dtype else f"{backend}:{name}"


def embedder_of(cfg: Any) -> tuple[str, str]:
    """(identity, name) of the embedder `cfg.scoring` asks for, without loading it: the score
    stage looks stored similarities up by the identity and loads a model only for new ones."""
    from wim.config import scoring_http
    from wim.precision import resolve_dtype

    scoring = cfg.scoring
    if scoring.backend == "http":
        model = scoring_http(cfg).model
        return embedder_identity("http", model), model
    dtype = resolve_dtype(scoring.dtype)
    return embedder_identity("sentence_transformers", scoring.embedder, dtype), scoring.embedder


def open_embedder(cfg: Any) -> Embedder | HTTPEmbedder:
    """The embedder `cfg.scoring` asks for (`cfg` a Config): in process, or on a server with
    `scoring.http`, each null field taken from the `http:` section."""
    from wim.backends import client_settings
    from wim.config import scoring_http

    scoring = cfg.scoring
    if scoring.backend == "http":
        endpoint = scoring_http(cfg)
        # Its own params only: `http.params` are the chat servers' (reasoning_effort, ...).
        return HTTPEmbedder(endpoint.model, endpoint.base_urls, scoring.batch_size,
                            params=scoring.http.params, **client_settings(endpoint))
    return Embedder(scoring.embedder, scoring.batch_size, scoring.dtype)
