"""The generate stage when `generation.source` is set: existing responses into samples.jsonl.

Nothing is sampled and no policy is loaded. Each response becomes one sample record, in the
source's order (sample_idx 0, 1, ...), with its origin (the model name where the source gives
one) and, where the source has them, its label (`source_label`: chosen / rejected) or rating
(`source_rating`), so that the report can compare our rankings with the source's own.
Prompts are batched as in sampling (data_gen/stages.py), so shards and resume work the same:
records already in samples.jsonl are kept, the missing ones are appended.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from data_gen.stages import Shard, _bar, _write_stats, prompt_batches
from wim.config import Config
from wim.records import JsonlAppender, index_by_key, read_keyed
from wim.rundir import RunDir
from wim.sources import SourcedPrompt, SourceSet

logger = logging.getLogger(__name__)


def import_samples(cfg: Config, run: RunDir, source: SourceSet, sha256: str,
                   shard: Shard | None = None, progress: bool = True) -> dict[str, Any]:
    """Write the source's responses as samples, skipping records already written."""
    start = time.perf_counter()
    by_id = {sp.prompt.id: sp for sp in source.prompts}
    batches = prompt_batches([sp.prompt for sp in source.prompts], cfg.generation.batch_size,
                             shard)
    done = index_by_key(read_keyed(run.samples))
    mine = [by_id[p.id] for _, batch in batches for p in batch]
    bar = _bar(sum(len(sp.responses) for sp in mine), "import", progress)
    with JsonlAppender(run.samples) as out:
        for sp in mine:
            records = [_record(cfg, sp, j) for j in range(len(sp.responses))
                       if (sp.prompt.id, j) not in done]
            out.write_all(records)
            bar.update(len(sp.responses))
    bar.close()
    samples = read_keyed(run.samples)
    origins = Counter(r.get("origin") or "(not given)" for r in samples)
    stats: dict[str, Any] = {
        "generate/records": len(samples),
        "generate/source": cfg.generation.source,
        "generate/source_shape": source.shape,
        "generate/source_sha256": sha256,
        "generate/source_rows": source.rows,
        "generate/source_prompts": len(source.prompts),
        "generate/source_too_few_responses": len(source.too_few),
        "generate/source_labels": sum(r.get("source_label") is not None for r in samples),
        "generate/source_ratings": sum(r.get("source_rating") is not None for r in samples),
        "generate/origins": dict(sorted(origins.items())),
        "generate/empty": sum(not r["response"].strip() for r in samples),
        "generate/backend_failed": 0,
        "tokens/policy/in": 0,
        "tokens/policy/out": 0,
        "time/generate": time.perf_counter() - start,
    }
    _write_stats(run, "generate", stats)
    return stats


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
