"""The score stage (`wim score`): scores.jsonl from judgements.jsonl (no judge calls), streamed
and resumable (docs/design.md, "Scoring and pairs").
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from data_gen.similarity_store import SimilarityStore, pair_key, text_key
from data_gen.stages import Shard, progress_bar
from wim.config import Config
from wim.records import JsonlAppender, iter_keyed, iter_records, record_key
from wim.rundir import JUDGEMENTS, SCORE_PROGRESS, SIMILARITIES, RunDir
from wim.scoring import (
    check_judgement,
    check_numeric,
    cosines,
    distinct_texts,
    has_critique,
    score_record,
    similarities,
)


def run_stage(cfg: Config, run: RunDir, res: Any, shard: Shard | None, progress: bool,
              fingerprint: str) -> dict[str, Any]:
    # `res`: the run's Resources (data_gen/pipeline.py, which imports this module).
    return score_run(cfg, run, progress=progress)


def score_run(cfg: Config, run: RunDir, embedder=None, progress: bool = False
              ) -> dict[str, Any]:
    """Score every judgement of `run`. `embedder`: one already loaded (with `identity`, `name`
    and `embed`); by default the config's, opened only when a similarity is missing."""
    from wim.embedders import embedder_of

    start = time.perf_counter()
    _require(run)
    identity, name = (embedder.identity, embedder.name) if embedder else embedder_of(cfg)
    zeta, policy, size = cfg.scoring.zeta, cfg.judge.on_parse_failure, cfg.scoring.batch_size
    settings = {"identity": identity, "zeta": zeta, "on_parse_failure": policy}
    kept = _resume_point(run, settings)
    counts = {"records": 0, "similarities_computed": 0, "similarities_stored": 0,
              "embedded_texts": 0, "fallback_rating": 0, "fallback_critique": 0}
    store = SimilarityStore(run.file(SIMILARITIES))
    lazy = _LazyEmbedder(cfg, embedder)
    out = None  # opened with the first batch: a first record that fails leaves no file
    bar = _bar(run, progress)
    try:
        for first, batch in _batches(run, size * _window(cfg, embedder)):
            sims = _similarities(batch, identity, policy, zeta, store, lazy, counts)
            records = [score_record(j, sims.get(i), zeta, policy, name)
                       for i, j in enumerate(batch)]
            for r in records:
                fallback = r.get("fallback", "")
                counts["fallback_rating"] += "rating" in fallback
                counts["fallback_critique"] += "critique" in fallback
            counts["records"] += len(records)
            out = out or JsonlAppender(run.scores)
            out.write_all(records[max(0, kept - first):])
            bar.update(len(records))
        store.drop_vectors()
    finally:
        bar.close()
        for part in (out, store, lazy):
            if part is not None:
                part.close()
    run.file(SCORE_PROGRESS).unlink(missing_ok=True)
    stats = {"time/score": time.perf_counter() - start, "score/records": counts.pop("records"),
             "score/embedder": name, "score/embedder_identity": identity, "score/zeta": zeta,
             "score/on_parse_failure": policy, **{f"score/{k}": v for k, v in counts.items()}}
    stats.update(lazy.stats())
    run.write_stats("score", stats)
    return stats


def store_similarities(cfg: Config, run: RunDir) -> dict[str, int]:
    """Fill DIR/similarities.sqlite without writing scores (`wim compare`: once for all arms)."""
    from wim.embedders import embedder_of

    _require(run)
    identity, policy = embedder_of(cfg)[0], cfg.judge.on_parse_failure
    counts = {"similarities_computed": 0, "similarities_stored": 0, "embedded_texts": 0}
    store = SimilarityStore(run.file(SIMILARITIES))
    lazy = _LazyEmbedder(cfg, None)
    try:
        for _, batch in _batches(run, cfg.scoring.batch_size * _window(cfg, None)):
            _similarities(batch, identity, policy, 1.0, store, lazy, counts)
        store.drop_vectors()
    finally:
        store.close()
        lazy.close()
    return counts


def _similarities(batch: list[dict], identity: str, policy: str, zeta: float,
                  store: SimilarityStore, lazy: _LazyEmbedder, counts: dict[str, int]
                  ) -> dict[int, float | None]:
    """{position in batch: similarity} of the judgements with a critique (wim.scoring): stored
    cosines reused, the missing ones computed and stored (not at zeta 0: None)."""
    for j in batch:
        check_numeric(j, zeta)
    wim = [i for i, j in enumerate(batch) if has_critique(j, policy)]

    def cosines_of(pairs: list[tuple[str, str]]) -> list[float | None]:
        keys = [pair_key(identity, r, c) for r, c in pairs]
        stored = store.similarities(keys)
        counts["similarities_stored"] += sum(k in stored for k in keys)
        missing = {k: pair for k, pair in zip(keys, pairs, strict=True) if k not in stored}
        if missing and zeta > 0:
            stored.update(_compute(missing, identity, store, lazy, counts))
        return [stored.get(k) for k in keys]

    values = similarities([batch[i]["response"] for i in wim], [batch[i]["critique"] for i in wim],
                          cosines_of)
    return dict(zip(wim, values, strict=True))


def _compute(missing: dict[bytes, tuple[str, str]], identity: str, store: SimilarityStore,
             lazy: _LazyEmbedder, counts: dict[str, int]) -> dict[bytes, float]:
    """The cosines of the `missing` pairs; each text embedded once (stored vectors reused)."""
    texts = {text_key(identity, t): t for t in distinct_texts(list(missing.values()))}
    vectors = store.vectors(texts)
    new = {k: t for k, t in texts.items() if k not in vectors}
    fresh: dict[bytes, np.ndarray] = {}
    if new:
        embedder = lazy.get()
        embedded = embedder.embed(list(new.values()))
        if hasattr(embedder, "forget"):
            embedder.forget()  # the store keeps the vectors; the embedder's cache would grow
        fresh = dict(zip(new, embedded, strict=True))
        vectors.update(fresh)
        counts["embedded_texts"] += len(new)
    resp = np.stack([vectors[text_key(identity, r)] for r, _ in missing.values()])
    crit = np.stack([vectors[text_key(identity, c)] for _, c in missing.values()])
    values = {k: float(v) for k, v in zip(missing, cosines(resp, crit), strict=True)}
    store.add(values, fresh)
    counts["similarities_computed"] += len(values)
    return values


def _window(cfg: Config, embedder) -> int:
    """Batches embedded at once: `concurrency` requests in flight to an embeddings server; in
    process one (its vectors then do not depend on where a resumed pass was cut)."""
    if embedder is not None:
        return getattr(embedder, "in_flight", 1)
    if cfg.scoring.backend == "http":
        from wim.config import scoring_http

        h = scoring_http(cfg)
        cap = h.max_concurrency if h.concurrency == "auto" else h.concurrency
        return max(1, cap // 2)  # two texts a judgement
    return 1


class _LazyEmbedder:
    """The given embedder, or the config's loaded on first use (none when all are stored)."""

    def __init__(self, cfg: Config, given) -> None:
        self.cfg, self.given, self.opened = cfg, given, None

    def get(self):
        if self.given is None and self.opened is None:
            from wim.embedders import open_embedder

            self.opened = open_embedder(self.cfg)
        return self.opened if self.given is None else self.given

    def stats(self) -> dict[str, Any]:
        embedder = self.given or self.opened
        if embedder is None:
            return {}
        out = {f"http/score/{k}": v for k, v in (getattr(embedder, "stats", None) or {}).items()}
        if getattr(embedder, "dtype", None):
            out["dtype/score"] = embedder.dtype
        return out

    def close(self) -> None:
        if self.opened is not None:
            self.opened.close()


def _require(run: RunDir) -> None:
    """A clear error when there are no judgements (checked on the first record: streamed)."""
    if next(iter_records(run.judgements), None) is None:
        run.require(JUDGEMENTS, "wim judge")


def _bar(run: RunDir, progress: bool):
    """A progress bar over the judgements (counted by their lines: one fast pass of bytes)."""
    total = None
    if progress:
        with open(run.judgements, "rb") as f:
            total = sum(1 for _ in f)
    return progress_bar(total, "score", progress, unit="judgement")


def _batches(run: RunDir, size: int) -> Iterator[tuple[int, list[dict]]]:
    """(index of the first record, validated judgements) of each batch of `size`."""
    batch: list[dict] = []
    for number, (_, j) in enumerate(iter_keyed(run.judgements), start=1):
        check_judgement(j, f"{run.judgements}, record {number}")
        batch.append(j)
        if len(batch) == size:
            yield number - size, batch
            batch = []
    if batch:
        yield number - len(batch), batch


def _resume_point(run: RunDir, settings: dict[str, Any]) -> int:
    """How many records of scores.jsonl a pass with `settings` keeps: those of an unfinished
    pass with the same settings that follow the judgements in order. The file is cut after
    them (to nothing for a new pass), and `settings` recorded as the pass under way."""
    marker = run.file(SCORE_PROGRESS)
    same = marker.is_file() and json.loads(marker.read_text() or "null") == settings
    kept = 0
    if same and run.scores.exists():
        judged = iter_records(run.judgements)
        for _, score in iter_records(run.scores):
            j = next(judged, None)
            if j is None or record_key(j[1]) != record_key(score):
                break
            kept += 1
    if run.scores.exists():
        with run.scores.open("rb+") as f:
            for _ in range(kept):
                f.readline()
            f.truncate()  # at the end of the kept lines
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(settings))
    return kept

