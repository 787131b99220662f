"""The generate stage when `generation.source` is set: existing responses into samples.jsonl,
streamed, nothing sampled (docs/design.md, "Responses from a source").
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from data_gen.stages import Shard, progress_bar, prompt_batches
from wim.config import Config
from wim.records import JsonlAppender, iter_keyed, read_keys
from wim.rundir import RunDir
from wim.sources import SourcedPrompt

logger = logging.getLogger(__name__)


def import_samples(cfg: Config, run: RunDir, res: Any, shard: Shard | None = None,
                   progress: bool = True) -> dict[str, Any]:
    """The source's responses as samples (a shard finds its batches by `res.batch_prompts()`)."""
    start = time.perf_counter()
    source, sha256 = res.source()
    mine = None
    if shard is not None:
        batches = prompt_batches(res.batch_prompts(), cfg.generation.batch_size, shard)
        mine = {p.id for _, batch in batches for p in batch}
    done = read_keys(run.samples)
    bar = progress_bar(None, "import", progress)
    with JsonlAppender(run.samples) as out:
        pending: list[dict[str, Any]] = []
        try:
            for sp in source:
                if mine is not None and sp.prompt.id not in mine:
                    continue
                pending += [_record(cfg, sp, j) for j in range(len(sp.responses))
                            if (sp.prompt.id, j) not in done]
                bar.update(len(sp.responses))
                if len(pending) >= 256:  # one fsync per few hundred records, not per prompt
                    out.write_all(pending)
                    pending = []
        finally:  # a bad row later in the source: the rows before it are written and kept
            out.write_all(pending)
    bar.close()
    stats = _sample_stats(run)
    stats.update({
        "generate/source": cfg.generation.source,
        "generate/source_shape": source.shape,
        "generate/source_sha256": sha256,
        "generate/source_rows": source.rows,
        "generate/source_prompts": source.kept,
        "generate/source_too_few_responses": len(source.too_few),
        "generate/backend_failed": 0,
        "tokens/policy/in": 0,
        "tokens/policy/out": 0,
        "time/generate": time.perf_counter() - start,
    })
    run.write_stats("generate", stats)
    return stats


def _sample_stats(run: RunDir) -> dict[str, Any]:
    """Counts of samples.jsonl in one streaming pass."""
    records, labels, ratings, empty = 0, 0, 0, 0
    origins: Counter = Counter()
    for _, r in iter_keyed(run.samples):
        records += 1
        origins[r.get("origin") or "(not given)"] += 1
        labels += r.get("source_label") is not None
        ratings += r.get("source_rating") is not None
        empty += not r["response"].strip()
    return {"generate/records": records, "generate/source_labels": labels,
            "generate/source_ratings": ratings, "generate/origins": dict(sorted(origins.items())),
            "generate/empty": empty}


def _record(cfg: Config, sp: SourcedPrompt, j: int) -> dict[str, Any]:
    p, r = sp.prompt, sp.responses[j]
    record: dict[str, Any] = {
        "prompt_id": p.id, "sample_idx": j, "domain": p.domain, "messages": list(p.messages),
        "prompt": p.text, "response": r.text, "origin": r.origin,
        "source": cfg.generation.source, "prompt_tokens": 0, "completion_tokens": 0,
    }
    if r.label is not None:
        record["source_label"] = r.label
    if r.rating is not None:
        record["source_rating"] = r.rating
    return record
