"""The score stage: scores.jsonl from judgements.jsonl (no judge calls); see wim/scoring.py."""

from __future__ import annotations

import time
from typing import Any

from data_gen.stages import _write_stats
from wim.config import Config
from wim.records import write_records_atomic
from wim.rundir import RunDir


def score_run(cfg: Config, run: RunDir, embedder=None) -> dict[str, Any]:
    """Re-derive scores.jsonl from judgements.jsonl (no judge calls).

    The judgements are validated first, since another tool may have written them.
    """
    from wim.embedders import Embedder
    from wim.parsing import is_nothing_missing
    from wim.scoring import check_judgements, score_judgements

    start = time.perf_counter()
    judgements = run.require("judgements.jsonl", "wim judge")
    check_judgements(judgements, str(run.judgements))
    policy = cfg.judge.on_parse_failure
    needs_embedder = any((j["parse_ok"] or policy == "authors") and j.get("critique") is not None
                         and not is_nothing_missing(j["critique"]) for j in judgements)
    if embedder is None and needs_embedder:
        embedder = Embedder(cfg.scoring.embedder, cfg.scoring.batch_size)
    scored = score_judgements(judgements, embedder, cfg.scoring.zeta, policy)
    write_records_atomic(run.scores, scored)
    fallbacks = [r.get("fallback", "") for r in scored]
    stats = {"time/score": time.perf_counter() - start, "score/records": len(scored),
             "score/embedder": cfg.scoring.embedder, "score/zeta": cfg.scoring.zeta,
             "score/on_parse_failure": policy,
             "score/fallback_rating": sum("rating" in f for f in fallbacks),
             "score/fallback_critique": sum("critique" in f for f in fallbacks)}
    _write_stats(run, "score", stats)
    return stats
