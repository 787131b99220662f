"""WIM scores (Stranges & Yang, 2026), exactly as the authors' public formula.

    rating_norm = (N - 5) / 5                       for an integer rating N in 1..10
    similarity  = cos(E(response), E(critique))     1.0 when nothing is missing
    score       = (1 - zeta) * rating_norm + zeta * similarity

zeta = 1 is pure WIM, zeta = 0 pure numeric. Reports put every score on one 1-10 scale
with `x * 5 + 5`, so numeric and WIM deltas compare directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wim.embedders import Embedder


def rating_norm(rating: int) -> float:
    if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 10:
        raise ValueError(f"rating must be an integer in 1..10, got {rating!r}")
    return (rating - 5) / 5


def mix_scores(rating_norm_value: float, similarity: float, zeta: float) -> float:
    if not 0.0 <= zeta <= 1.0:
        raise ValueError(f"zeta must lie in [0, 1], got {zeta}")
    return (1.0 - zeta) * rating_norm_value + zeta * similarity


def to_ten_point(x: float) -> float:
    """Map a score in [-1, 1] onto the 1-10 rating scale (x * 5 + 5)."""
    return x * 5.0 + 5.0


def similarities(responses: list[str], critiques: list[str], embedder: Embedder) -> list[float]:
    """cos(E(response), E(critique)); an empty critique (nothing missing) gives 1.0."""
    out = [1.0] * len(responses)
    todo = [i for i, c in enumerate(critiques) if c.strip()]
    if todo:
        resp = embedder.embed([responses[i] for i in todo])
        crit = embedder.embed([critiques[i] for i in todo])
        # Embeddings are unit length, so the dot product is the cosine.
        cos = np.clip(np.sum(resp * crit, axis=1), -1.0, 1.0)
        for i, value in zip(todo, cos, strict=True):
            out[i] = float(value)
    return out


def score_judgements(
    judgements: list[dict[str, Any]], embedder: Embedder | None, zeta: float
) -> list[dict[str, Any]]:
    """scores.jsonl records: each judgement plus rating_norm, similarity, score, zeta, embedder.

    A judgement that failed to parse keeps `score: None` and stays out of ranking. In numeric
    mode (no critique) only zeta = 0 is defined.
    """
    ok = [j for j in judgements if j["parse_ok"]]
    numeric = [j for j in ok if j.get("critique") is None]
    if numeric and zeta > 0:
        raise ValueError(
            "these judgements are numeric-only (judge.mode=numeric), so they have no critique "
            f"to embed; set scoring.zeta=0 (got {zeta})"
        )
    wim = [j for j in ok if j.get("critique") is not None]
    sims = {}
    if wim:
        if embedder is None:
            raise ValueError("WIM judgements need an embedder")
        values = similarities([j["response"] for j in wim], [j["critique"] for j in wim], embedder)
        sims = {(j["prompt_id"], j["sample_idx"]): s for j, s in zip(wim, values, strict=True)}
    records = []
    for j in judgements:
        record = dict(j)
        record.update(rating_norm=None, similarity=None, score=None, zeta=zeta,
                      embedder=embedder.name if embedder else None)
        if j["parse_ok"]:
            rn = rating_norm(j["rating"])
            sim = sims.get((j["prompt_id"], j["sample_idx"]))
            record.update(rating_norm=rn, similarity=sim,
                          score=mix_scores(rn, sim if sim is not None else 0.0, zeta))
        records.append(record)
    return records
