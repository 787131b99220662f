"""Pipeline stages over many prompts: sample, judge, score, export pairs.

Prompts are sorted by length (less padding) and cut into fixed batches. A batch's seed comes
from its index, and batches, not prompts, are what shards split and what resume skips, so a
resumed run or a set of merged shards holds exactly the records of one uninterrupted run.
Samples and judgements are appended record by record; scores and pairs are derived files
rewritten whole.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from wim.backends import Backend, SamplingParams
from wim.config import Config
from wim.errors import InputError
from wim.judges import Judge
from wim.prompts import Prompt
from wim.records import JsonlAppender, index_by_key, read_records, write_records_atomic
from wim.rundir import RunDir

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @classmethod
    def parse(cls, text: str | None) -> Shard | None:
        if not text:
            return None
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            i, n = -1, 0
        if not 0 <= i < n:
            raise InputError(f"--shard must look like i/n with 0 <= i < n (e.g. 0/2), got '{text}'")
        return cls(i, n)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def prompt_batches(prompts: list[Prompt], batch_size: int, shard: Shard | None = None):
    """[(batch index, prompts)], sorted by length, this shard's share only."""
    ordered = sorted(prompts, key=lambda p: (sum(len(m["content"]) for m in p.messages), p.id))
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    return [(b, batch) for b, batch in enumerate(batches)
            if shard is None or b % shard.count == shard.index]


def batch_seed(seed: int, stage: str, batch_index: int) -> int:
    return (seed * 1_000_003 + batch_index * 7_919 + (1 if stage == "judge" else 0)) % (2**31)


def _write_stats(run: RunDir, stage: str, stats: dict[str, Any]) -> None:
    folder = run.file("stats")
    folder.mkdir(exist_ok=True)
    (folder / f"{stage}.json").write_text(json.dumps(stats, indent=2))


def _bar(total: int, desc: str, progress: bool):
    return tqdm(total=total, desc=desc, unit="sample", disable=not progress, dynamic_ncols=True)


def generate_samples(cfg: Config, run: RunDir, prompts: list[Prompt], backend: Backend,
                     shard: Shard | None = None, progress: bool = True) -> dict[str, Any]:
    """Sample k responses per prompt into samples.jsonl, skipping batches already done."""
    k = cfg.generation.k
    params = SamplingParams(cfg.generation.max_new_tokens, cfg.generation.temperature,
                            cfg.generation.top_p)
    done = index_by_key(read_records(run.samples))
    batches = prompt_batches(prompts, cfg.generation.batch_size, shard)
    start, new_tokens, failed = time.perf_counter(), 0, 0
    bar = _bar(sum(len(b) for _, b in batches) * k, "generate", progress)
    with JsonlAppender(run.samples) as out:
        for b, batch in batches:
            missing = [(p, j) for p in batch for j in range(k) if (p.id, j) not in done]
            bar.update(len(batch) * k - len(missing))
            if not missing:
                continue
            # The whole batch is regenerated with its own seed, so the samples are identical
            # to an uninterrupted run; only the missing ones are written.
            outs = backend.generate([list(p.messages) for p in batch], params, n=k,
                                    seed=batch_seed(cfg.seed, "generate", b))
            records = []
            for p, completions in zip(batch, outs, strict=True):
                for j, c in enumerate(completions):
                    if (p.id, j) in done:
                        continue
                    if not c.ok:
                        failed += 1
                        logger.warning("sample %s/%d failed: %s", p.id, j, c.error)
                        continue
                    records.append(_sample_record(cfg, p, j, c))
                    new_tokens += c.completion_tokens
            out.write_all(records)
            bar.update(len(missing))
            bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - start):.1f}")
    bar.close()
    stats = _token_stats(read_records(run.samples), "generate", "policy")
    stats.update({"generate/failed": failed, "time/generate": time.perf_counter() - start})
    stats.update(_backend_stats(backend, "policy"))
    _write_stats(run, "generate", stats)
    return stats


def _sample_record(cfg: Config, prompt: Prompt, j: int, c) -> dict[str, Any]:
    return {
        "prompt_id": prompt.id, "sample_idx": j, "domain": prompt.domain,
        "messages": list(prompt.messages), "prompt": prompt.text, "response": c.text,
        "policy": cfg.policy.model, "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
    }


def _token_stats(records: list[dict], stage: str, role: str) -> dict[str, Any]:
    prompt_tokens = sum(r.get("prompt_tokens", 0) for r in records)
    completion_tokens = sum(r.get("completion_tokens", 0) for r in records)
    return {
        f"{stage}/records": len(records),
        f"tokens/{role}/in": prompt_tokens,
        f"tokens/{role}/out": completion_tokens,
    }


def judge_samples(cfg: Config, run: RunDir, prompts: list[Prompt], judge: Judge,
                  shard: Shard | None = None, progress: bool = True) -> dict[str, Any]:
    """Judge every sample into judgements.jsonl, one generation batch at a time."""
    samples = index_by_key(read_records(run.samples))
    done = index_by_key(read_records(run.judgements))
    batches = prompt_batches(prompts, cfg.generation.batch_size, shard)
    start, failed = time.perf_counter(), sum(not r["parse_ok"] for r in done.values())
    tokens = 0
    bar = _bar(len(samples), "judge", progress)
    with JsonlAppender(run.judgements) as out:
        for b, batch in batches:
            keys = [(p.id, j) for p in batch for j in range(cfg.generation.k)
                    if (p.id, j) in samples]
            missing = [key for key in keys if key not in done]
            bar.update(len(keys) - len(missing))
            if not missing:
                continue
            items = [(samples[key]["prompt"], samples[key]["response"]) for key in keys]
            results = judge.judge(items, seed=batch_seed(cfg.seed, "judge", b))
            records = [_judgement_record(samples[key], judge, res)
                       for key, res in zip(keys, results, strict=True) if key not in done]
            out.write_all(records)
            bar.update(len(missing))
            failed += sum(not r["parse_ok"] for r in records)
            tokens += sum(r["completion_tokens"] for r in records)
            bar.set_postfix(parse_failed=failed,
                            tok_s=f"{tokens / (time.perf_counter() - start):.1f}")
    bar.close()
    judgements = read_records(run.judgements)
    stats = _token_stats(judgements, "judge", "judge")
    stats["time/judge"] = time.perf_counter() - start
    stats.update(_backend_stats(getattr(judge, "backend", None), "judge"))
    _write_stats(run, "judge", stats)
    return stats


def _backend_stats(backend, role: str) -> dict[str, int]:
    """Request, retry and failure counts of an HTTP backend (`http/judge/retries`, ...)."""
    counts = getattr(backend, "stats", None) or {}
    return {f"http/{role}/{k}": v for k, v in counts.items()}


def _judgement_record(sample: dict, judge: Judge, res) -> dict[str, Any]:
    record = {k: v for k, v in sample.items() if k not in ("prompt_tokens", "completion_tokens")}
    record.update(
        judge_role=judge.role, judge_model=judge.model_name, critique=res.critique,
        rating=res.rating, raw_judge_text=res.raw, parse_ok=res.parse_ok,
        parse_error=res.error, attempts=res.attempts, echoed_attempts=res.echoed_attempts,
        prompt_tokens=res.prompt_tokens,
        completion_tokens=res.completion_tokens,
    )
    return record


def score_run(cfg: Config, run: RunDir, embedder=None) -> dict[str, Any]:
    """Re-derive scores.jsonl from judgements.jsonl (no judge calls).

    The judgements are validated first, since another tool may have written them.
    """
    from wim.embedders import Embedder
    from wim.parsing import is_nothing_missing
    from wim.scoring import check_judgements, score_judgements

    start = time.perf_counter()
    judgements = read_records(run.judgements)
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


def export_pairs(cfg: Config, run: RunDir, save_dataset: bool = True) -> dict[str, Any]:
    """pairs.jsonl plus a saved datasets folder DIR/pairs/ (and push_to_hub when configured)."""
    from wim.pairs import build_pairs

    start = time.perf_counter()
    rows, counts = build_pairs(read_records(run.scores), cfg.pairs, seed=cfg.seed)
    write_records_atomic(run.pairs, rows)
    if save_dataset and rows:
        _save_dataset(cfg, run.pairs, run.file("pairs"))
    stats = counts.as_metrics()
    stats["time/pairs"] = time.perf_counter() - start
    _write_stats(run, "pairs", stats)
    return stats


def _save_dataset(cfg: Config, jsonl: Path, folder: Path) -> None:
    from datasets import load_dataset

    dataset = load_dataset("json", data_files=str(jsonl), split="train")
    dataset.save_to_disk(str(folder))
    if cfg.export.push_to_hub:
        dataset.push_to_hub(cfg.export.push_to_hub)
