"""WIM scores (Stranges & Yang, 2026), exactly as the authors' public formula: rating_norm,
the critique's similarity and their mix by zeta (docs/design.md, "Methods", has the formula and
the 1-10 scale reports use).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from wim.embedders import Embedder
from wim.errors import InputError
from wim.parsing import is_nothing_missing, normalize_critique
from wim.records import RecordsError


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


def is_tie(gap: float, tolerance: float) -> bool:
    """Two values `gap` apart tie under `tolerance` (both on the 1-10 scale): the one tie rule
    of the pairs and the report."""
    return abs(gap) <= tolerance


def ten_point_gap(a: float, b: float) -> float:
    """The difference of two scores in [-1, 1], measured on the 1-10 scale."""
    return to_ten_point(a) - to_ten_point(b)


def cosines(responses: np.ndarray, critiques: np.ndarray) -> np.ndarray:
    """Row by row cos(E(response), E(critique)). The embedders return unit vectors, so the dot
    product is the cosine; the clip keeps rounding inside [-1, 1]."""
    return np.clip(np.sum(responses * critiques, axis=1), -1.0, 1.0)


CosinesOf = Callable[[list[tuple[str, str]]], list[float | None]]


def similarities(responses: list[str], critiques: list[str], cosines_of: CosinesOf
                 ) -> list[float | None]:
    """The similarity of each judgement: 1.0 when its critique says nothing is missing
    (`is_nothing_missing`, applied to every critique, also those another tool wrote), else
    `cosines_of` [(response, critique stripped)] (None where not computed: zeta 0). The one
    place of the rule, for the score stage, validity and online DPO alike."""
    out: list[float | None] = [1.0] * len(responses)
    todo = [i for i, c in enumerate(critiques) if not is_nothing_missing(c)]
    if todo:
        values = cosines_of([(responses[i], critiques[i].strip()) for i in todo])
        for i, value in zip(todo, values, strict=True):
            out[i] = value
    return out


def distinct_texts(pairs: list[tuple[str, str]]) -> list[str]:
    """Each text of the pairs once, in order (response, critique, response, ...): the one order
    in which every path hands texts to the embedder, so their vectors are the same."""
    return list(dict.fromkeys(t for pair in pairs for t in pair))


def cosines_by(embedder: Embedder | None) -> CosinesOf:
    """`cosines_of` that embeds the pairs' distinct texts in one call."""

    def cosines_of(pairs: list[tuple[str, str]]) -> list[float | None]:
        if embedder is None:
            raise InputError("WIM judgements need an embedder (scoring.embedder)")
        texts = distinct_texts(pairs)
        vectors = dict(zip(texts, embedder.embed(texts), strict=True))
        values = cosines(np.stack([vectors[r] for r, _ in pairs]),
                         np.stack([vectors[c] for _, c in pairs]))
        return [float(v) for v in values]

    return cosines_of


def score_judgements(
    judgements: list[dict[str, Any]], embedder: Embedder | None, zeta: float,
    on_parse_failure: str = "exclude", batch_size: int | None = None,
) -> list[dict[str, Any]]:
    """scores.jsonl records: each judgement plus rating_norm, similarity, score, zeta, embedder
    (`on_parse_failure`: see `score_record`; numeric judgements only at zeta 0). `batch_size`:
    embed batch by batch, as the score stage (data_gen/score.py, which adds stored
    similarities) does with an in-process embedder, so both give the same vectors."""
    for j in judgements:
        check_numeric(j, zeta)
    cosines_of = cosines_by(embedder)
    size = batch_size or max(1, len(judgements))
    sims: dict[tuple[Any, Any], float | None] = {}
    for start in range(0, len(judgements), size):
        wim = [j for j in judgements[start:start + size] if has_critique(j, on_parse_failure)]
        values = similarities([j["response"] for j in wim], [j["critique"] for j in wim],
                              cosines_of)
        sims.update({(j["prompt_id"], j["sample_idx"]): s for j, s in zip(wim, values,
                                                                           strict=True)})
    name = embedder.name if embedder else None
    return [score_record(j, sims.get((j["prompt_id"], j["sample_idx"])), zeta, on_parse_failure,
                         name) for j in judgements]


def has_critique(j: dict[str, Any], on_parse_failure: str) -> bool:
    """The judgement gets a similarity: parsed (or failures count: `authors`), with a critique."""
    return (j["parse_ok"] or on_parse_failure == "authors") and isinstance(j.get("critique"), str)


def check_numeric(j: dict[str, Any], zeta: float) -> None:
    """A numeric judgement (parsed, no critique) has a score only at zeta 0."""
    if zeta > 0 and j["parse_ok"] and j.get("critique") is None:
        raise InputError(
            "these judgements are numeric-only (judge.mode=numeric), so they have no critique "
            f"to embed; set scoring.zeta=0 (got {zeta})"
        )


def score_record(j: dict[str, Any], sim: float | None, zeta: float, on_parse_failure: str,
                 embedder: str | None) -> dict[str, Any]:
    """One scores.jsonl record. `sim`: the judgement's similarity, or None (no critique; or
    not computed at zeta 0, where the score does not use it). A judgement that failed to parse
    keeps `score: None` (`exclude`), or (`authors`, the WIM authors' code) counts an unparseable
    rating as rating_norm 0 and scores a missing critique by the rating alone, with `fallback`
    ("rating", "critique" or "rating+critique") so it is counted."""
    record = dict(j)
    record.update(rating_norm=None, similarity=None, score=None, zeta=zeta, embedder=embedder)
    if isinstance(j.get("critique"), str):
        record["critique"] = normalize_critique(j["critique"])
    if j["parse_ok"]:
        rn = rating_norm(j["rating"])
        record.update(rating_norm=rn, similarity=sim,
                      score=mix_scores(rn, sim if sim is not None else 0.0, zeta))
    elif on_parse_failure == "authors":
        valid = isinstance(j.get("rating"), int) and 1 <= j["rating"] <= 10
        rn = rating_norm(j["rating"]) if valid else 0.0
        critique = isinstance(j.get("critique"), str)
        missed = ([] if valid else ["rating"]) + ([] if critique else ["critique"])
        # At zeta 0 the similarity may be left uncomputed: the score is the rating either way.
        score = rn if not critique else mix_scores(rn, sim if sim is not None else 0.0, zeta)
        record.update(rating_norm=rn, similarity=sim, score=score, fallback="+".join(missed))
    return record


def check_judgement(j: dict[str, Any], where: str) -> None:
    """Validate a judgement read from disk (maybe written by another tool) before scoring.
    Raises RecordsError naming `where` ("FILE, record N") and the key."""
    for key, kinds in (("prompt_id", (str, int)), ("sample_idx", (int,)), ("response", (str,)),
                       ("parse_ok", (bool,))):
        value = j.get(key)
        if not isinstance(value, kinds) or (kinds == (int,) and isinstance(value, bool)):
            names = " or ".join(k.__name__ for k in kinds)
            raise RecordsError(f"{where}: '{key}' is missing or not a {names}, got {value!r}.")
    critique, rating = j.get("critique"), j.get("rating")
    if critique is not None and not isinstance(critique, str):
        raise RecordsError(f"{where}: 'critique' must be a string or null, got {critique!r}.")
    valid = isinstance(rating, int) and not isinstance(rating, bool) and 1 <= rating <= 10
    if rating is not None and not valid:
        raise RecordsError(f"{where}: 'rating' must be an integer in 1..10 or null, got "
                           f"{rating!r}.")
    if j["parse_ok"] and rating is None:
        raise RecordsError(f"{where}: 'parse_ok' is true but 'rating' is null.")
