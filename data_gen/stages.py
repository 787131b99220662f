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
from wim.context import fit_messages, token_budget
from wim.errors import InputError
from wim.judges import Judge
from wim.prompts import Prompt
from wim.records import JsonlAppender, index_by_key, read_keyed, write_records_atomic
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
    """Sample k responses per prompt into samples.jsonl, skipping batches already done.

    A prompt longer than the context is cut or skipped (generation.overlong, wim/context.py)
    before batching; a failed sample is not recorded, so running again retries it.
    """
    k = cfg.generation.k
    params = SamplingParams(cfg.generation.max_new_tokens, cfg.generation.temperature,
                            cfg.generation.top_p)
    done = index_by_key(read_keyed(run.samples))
    batches = prompt_batches(prompts, cfg.generation.batch_size, shard)
    fits = _fit_prompts(cfg, [p for _, batch in batches for p in batch], backend)
    start, new_tokens, failed = time.perf_counter(), 0, 0
    bar = _bar(sum(len(b) for _, b in batches) * k, "generate", progress)
    with JsonlAppender(run.samples) as out:
        for b, batch in batches:
            live = [p for p in batch if fits[p.id][0] is not None]
            missing = [(p, j) for p in live for j in range(k) if (p.id, j) not in done]
            bar.update(len(batch) * k - len(missing))
            if not missing:
                continue
            # The whole batch is regenerated with its own seed, so the samples are identical
            # to an uninterrupted run; only the missing ones are written.
            outs = backend.generate([fits[p.id][0] for p in live], params, n=k,
                                    seed=batch_seed(cfg.seed, "generate", b))
            records = []
            for p, completions in zip(live, outs, strict=True):
                for j, c in enumerate(completions):
                    if (p.id, j) in done:
                        continue
                    if not c.ok:  # not recorded: the same command run again retries it
                        failed += 1
                        logger.warning("sample %s/%d failed: %s", p.id, j, c.error)
                        continue
                    records.append(_sample_record(cfg, p, j, c, truncated=fits[p.id][1]))
                    new_tokens += c.completion_tokens
            out.write_all(records)
            bar.update(len(missing))
            bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - start):.1f}")
    bar.close()
    samples = read_keyed(run.samples)
    stats = _token_stats(samples, "generate", "policy")
    stats.update({
        "generate/backend_failed": failed,
        "generate/truncated": sum(truncated for _, truncated in fits.values()),
        "generate/skipped_overlong": sum(msgs is None for msgs, _ in fits.values()),
        "generate/empty": sum(not r["response"].strip() for r in samples),
        "time/generate": time.perf_counter() - start,
    })
    stats.update(_backend_stats(backend, "policy"))
    _write_stats(run, "generate", stats)
    return stats


def _fit_prompts(cfg: Config, prompts: list[Prompt], backend: Backend):
    """{prompt id: (messages to send or None when skipped, truncated?)}."""
    g = cfg.generation
    budget = token_budget(backend.context_tokens, g.max_new_tokens, g.max_prompt_tokens)
    fits = {p.id: fit_messages(list(p.messages), budget, g.overlong, backend.count_tokens)
            for p in prompts}
    for p in prompts:
        if fits[p.id][0] is None or fits[p.id][1]:
            logger.warning("prompt %s is longer than %s prompt tokens: %s", p.id, budget,
                           "skipped" if fits[p.id][0] is None else "cut from the middle")
    return fits


def _sample_record(cfg: Config, prompt: Prompt, j: int, c, truncated: bool) -> dict[str, Any]:
    record = {
        "prompt_id": prompt.id, "sample_idx": j, "domain": prompt.domain,
        "messages": list(prompt.messages), "prompt": prompt.text, "response": c.text,
        "policy": cfg.policy.model, "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
    }
    if truncated:  # the policy saw the prompt cut from the middle (messages stay whole)
        record["prompt_truncated"] = True
    return record


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
    samples = index_by_key(run.require("samples.jsonl", "wim generate"))
    done = index_by_key(_final_judgements(run))
    batches = prompt_batches(prompts, cfg.generation.batch_size, shard)
    keys_of: dict[str, list[tuple[str, int]]] = {}  # k samples, or a source's own count
    for key in sorted(samples):
        keys_of.setdefault(key[0], []).append(key)
    start, failed = time.perf_counter(), sum(not r["parse_ok"] for r in done.values())
    tokens, lost = 0, 0
    bar = _bar(len(samples), "judge", progress)
    overlong = {"truncated": 0, "skipped": 0}
    with JsonlAppender(run.judgements) as out:
        for b, batch in batches:
            keys = [key for p in batch for key in keys_of.get(p.id, [])]
            fits = judge.fit([(samples[key]["prompt"], samples[key]["response"]) for key in keys],
                             cfg.judge.overlong, cfg.judge.max_input_tokens)
            overlong["truncated"] += sum(cut for _, cut in fits)
            overlong["skipped"] += sum(item is None for item, _ in fits)
            live = [(key, item, cut) for key, (item, cut) in zip(keys, fits, strict=True)
                    if item is not None]
            missing = [key for key, _, _ in live if key not in done]
            bar.update(len(keys) - len(missing))
            if not missing:
                continue
            results = judge.judge([item for _, item, _ in live],
                                  seed=batch_seed(cfg.seed, "judge", b))
            new = [(key, cut, res) for (key, _, cut), res in zip(live, results, strict=True)
                   if key not in done]
            # A backend failure is no verdict: left out, so the next run judges it again.
            lost += sum(res.backend_failed for _, _, res in new)
            records = [_judgement_record(samples[key], judge, res, cut) for key, cut, res in new
                       if not res.backend_failed]
            out.write_all(records)
            bar.update(len(missing))
            failed += sum(not r["parse_ok"] for r in records)
            tokens += sum(r["completion_tokens"] for r in records)
            bar.set_postfix(parse_failed=failed, backend_failed=lost,
                            tok_s=f"{tokens / (time.perf_counter() - start):.1f}")
    bar.close()
    judgements = read_keyed(run.judgements)
    stats = _token_stats(judgements, "judge", "judge")
    stats.update({"judge/parse_failed": sum(not r["parse_ok"] for r in judgements),
                  "judge/backend_failed": lost, "judge/truncated": overlong["truncated"],
                  "judge/skipped_overlong": overlong["skipped"],
                  "time/judge": time.perf_counter() - start})
    stats.update(_backend_stats(getattr(judge, "backend", None), "judge"))
    _write_stats(run, "judge", stats)
    return stats


def _final_judgements(run: RunDir) -> list[dict[str, Any]]:
    """The judgements to keep. Older versions recorded backend failures as parse failures;
    those are dropped from the file (rewritten whole) so that they are judged again."""
    records = read_keyed(run.judgements)
    final = [r for r in records
             if r["parse_ok"] or not str(r.get("parse_error") or "").startswith("backend failed")]
    if len(final) < len(records):
        logger.info("%d judgements lost to backend failures will be judged again",
                    len(records) - len(final))
        write_records_atomic(run.judgements, final)
    return final


def _backend_stats(backend, role: str) -> dict[str, Any]:
    """Request, retry and failure counts of an HTTP backend (`http/judge/retries`, ...); for a
    local model the dtype it computed in (`dtype/judge`) and the machine it was picked for
    (`machine/cpu_capability`, `machine/native_bf16`, ...: wim/precision.py)."""
    counts = getattr(backend, "stats", None) or {}
    stats: dict[str, Any] = {f"http/{role}/{k}": v for k, v in counts.items()}
    if getattr(backend, "dtype", None):
        from wim.precision import machine

        stats[f"dtype/{role}"] = backend.dtype
        stats.update({f"machine/{k}": v for k, v in machine().describe().items()})
    return stats


def _judgement_record(sample: dict, judge: Judge, res, truncated: bool) -> dict[str, Any]:
    record = {k: v for k, v in sample.items() if k not in ("prompt_tokens", "completion_tokens")}
    record.update(
        judge_role=judge.role, judge_model=judge.model_name, critique=res.critique,
        rating=res.rating, raw_judge_text=res.raw, parse_ok=res.parse_ok,
        parse_error=res.error, attempts=res.attempts, echoed_attempts=res.echoed_attempts,
        prompt_tokens=res.prompt_tokens,
        completion_tokens=res.completion_tokens,
    )
    if truncated:  # the judge saw the prompt cut from the middle (the response whole)
        record["judge_prompt_truncated"] = True
    served = getattr(judge, "served_model", None)
    if served:  # which name the server judged by (base model, or a round's adapter)
        record["judge_served_model"] = served
    return record


def export_pairs(cfg: Config, run: RunDir, save_dataset: bool = True) -> dict[str, Any]:
    """pairs.jsonl plus a saved datasets folder DIR/pairs/ (and push_to_hub when configured),
    each with its dataset card (wim/card.py); DIR/agreement.json when the responses came from
    a source with its own preferences (data_gen/agreement.py)."""
    from data_gen.agreement import source_agreement
    from wim.pairs import build_pairs

    start = time.perf_counter()
    scores = run.require("scores.jsonl", "wim score")
    rows, counts = build_pairs(scores, cfg.pairs, seed=cfg.seed)
    write_records_atomic(run.pairs, rows)
    stats = counts.as_metrics()
    folder = run.file("pairs")
    if save_dataset and rows:
        _save_dataset(run.pairs, folder)
    cards = _write_cards(cfg, run, scores, stats)
    if save_dataset and rows and cfg.export.push_to_hub:
        _push(cfg.export.push_to_hub, folder, cards)
    agreement = source_agreement(cfg, run, scores)
    if agreement is not None:
        stats["agreement/pairs"] = agreement["pairs"]
        stats["agreement/label_ties"] = agreement["label_ties"]
    stats["time/pairs"] = time.perf_counter() - start
    _write_stats(run, "pairs", stats)
    return stats


def _write_cards(cfg: Config, run: RunDir, scores: list[dict], counts: dict[str, Any]) -> str:
    """DIR/pairs/README.md (configs: the saved folder's arrow files) and DIR/pairs.README.md
    (configs: pairs.jsonl) for the Hub; returns the card text the Hub gets (its layout)."""
    from wim.card import render_card

    source = None  # the generate stage's stats name the source's shape and sha256
    if cfg.generation.source is not None and run.file("stats/generate.json").is_file():
        source = json.loads(run.file("stats/generate.json").read_text())
    folder = run.file("pairs")
    folder.mkdir(exist_ok=True)  # the card is written even when there is no pair
    (folder / "README.md").write_text(render_card(cfg, scores, counts, "data-*.arrow", source))
    run.file("pairs.README.md").write_text(render_card(cfg, scores, counts, "pairs.jsonl",
                                                       source))
    return render_card(cfg, scores, counts, "data/train-*", source)


def _save_dataset(jsonl: Path, folder: Path) -> None:
    from datasets import load_dataset

    dataset = load_dataset("json", data_files=str(jsonl), split="train")
    dataset.save_to_disk(str(folder))


def _push(repo: str, folder: Path, card: str) -> None:
    """The card goes up first: `push_to_hub` then adds its dataset_info and configs to the
    README it finds and keeps our text (datasets 5.2, arrow_dataset.py)."""
    from datasets import load_from_disk
    from huggingface_hub import DatasetCard, HfApi

    HfApi().create_repo(repo, repo_type="dataset", exist_ok=True)
    DatasetCard(card).push_to_hub(repo, repo_type="dataset")
    load_from_disk(str(folder)).push_to_hub(repo)
