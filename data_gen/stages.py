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
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from data_gen.flow import batch_window, ordered_map
from wim.backends import Backend, SamplingParams
from wim.config import Config
from wim.context import fit_messages, token_budget
from wim.errors import InputError
from wim.judges import Judge
from wim.prompts import Prompt, PromptRef
from wim.records import (
    JsonlAppender,
    KeySet,
    RecordIndex,
    iter_keyed,
    read_keys,
    record_key,
    write_records_atomic,
)
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


def prompt_batches(prompts: Sequence[Prompt | PromptRef], batch_size: int,
                   shard: Shard | None = None):
    """[(batch index, prompts)], sorted by length, this shard's share only. A `PromptRef`
    (id and length) batches exactly as its `Prompt` would."""
    ordered = sorted(prompts, key=lambda p: (p.length, p.id))
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    return [(b, batch) for b, batch in enumerate(batches)
            if shard is None or b % shard.count == shard.index]


def batch_seed(seed: int, stage: str, batch_index: int) -> int:
    return (seed * 1_000_003 + batch_index * 7_919 + (1 if stage == "judge" else 0)) % (2**31)


def _write_stats(run: RunDir, stage: str, stats: dict[str, Any]) -> None:
    folder = run.file("stats")
    folder.mkdir(exist_ok=True)
    (folder / f"{stage}.json").write_text(json.dumps(stats, indent=2))


def _bar(total: int | None, desc: str, progress: bool):
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
    done = read_keys(run.samples)
    batches = prompt_batches(prompts, cfg.generation.batch_size, shard)
    fits = _fit_prompts(cfg, [p for _, batch in batches for p in batch], backend)
    start, new_tokens, failed = time.perf_counter(), 0, 0
    bar = _bar(sum(len(b) for _, b in batches) * k, "generate", progress)

    def todo():  # the batches with a missing sample, read lazily by ordered_map
        for b, batch in batches:
            live = [p for p in batch if fits[p.id][0] is not None]
            missing = [(p, j) for p in live for j in range(k) if (p.id, j) not in done]
            bar.update(len(batch) * k - len(missing))
            if missing:
                yield b, live, len(missing)

    def sample(item):
        # The whole batch is regenerated with its own seed, so the samples are identical
        # to an uninterrupted run; only the missing ones are written.
        b, live, _ = item
        return backend.generate([fits[p.id][0] for p in live], params, n=k,
                                seed=batch_seed(cfg.seed, "generate", b))

    window = batch_window(backend.max_in_flight, cfg.generation.batch_size)
    with JsonlAppender(run.samples) as out:
        for (_, live, missing), outs in ordered_map(sample, todo(), window):
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
            bar.update(missing)
            bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - start):.1f}")
    bar.close()
    stats = _token_stats(run.samples, "generate", "policy")
    stats.update({
        "generate/backend_failed": failed,
        "generate/truncated": sum(truncated for _, truncated in fits.values()),
        "generate/skipped_overlong": sum(msgs is None for msgs, _ in fits.values()),
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


def _token_stats(path: Path, stage: str, role: str) -> dict[str, Any]:
    """Records, tokens, empty responses and failed parses of a stage file, in one streaming
    pass (records are counted, never held)."""
    records, prompt_tokens, completion_tokens, empty, failed = 0, 0, 0, 0, 0
    for _, r in iter_keyed(path):
        records += 1
        prompt_tokens += r.get("prompt_tokens", 0)
        completion_tokens += r.get("completion_tokens", 0)
        empty += not str(r.get("response") or "").strip()
        failed += not r.get("parse_ok", True)
    stats: dict[str, Any] = {
        f"{stage}/records": records,
        f"tokens/{role}/in": prompt_tokens,
        f"tokens/{role}/out": completion_tokens,
    }
    if stage == "generate":
        stats["generate/empty"] = empty
    else:
        stats[f"{stage}/parse_failed"] = failed
    return stats


def judge_samples(cfg: Config, run: RunDir, prompts: Sequence[Prompt | PromptRef], judge: Judge,
                  shard: Shard | None = None, progress: bool = True) -> dict[str, Any]:
    """Judge every sample into judgements.jsonl, one generation batch at a time, with several
    batches in flight when the judge's backend serves many requests at once (data_gen/flow.py);
    records are still written batch by batch in batch order. samples.jsonl is indexed (the
    offsets of each prompt's records), and a batch's samples are read when it runs."""
    samples = RecordIndex(run.samples)
    if not len(samples):
        run.require("samples.jsonl", "wim generate")  # the clear error: nothing to judge
    done, failed = _judged_keys(run)
    batches = prompt_batches(prompts, cfg.generation.batch_size, shard)
    start, tokens, lost = time.perf_counter(), 0, 0
    bar = _bar(sum(samples.sample_count(p.id) for _, batch in batches for p in batch), "judge",
               progress)
    overlong = {"truncated": 0, "skipped": 0}

    def todo():  # batches with a sample not judged yet, their samples read as they are needed
        for b, batch in batches:
            records = samples.read(p.id for p in batch)
            fits = judge.fit([(r["prompt"], r["response"]) for r in records],
                             cfg.judge.overlong, cfg.judge.max_input_tokens)
            overlong["truncated"] += sum(cut for _, cut in fits)
            overlong["skipped"] += sum(item is None for item, _ in fits)
            live = [(r, item, cut) for r, (item, cut) in zip(records, fits, strict=True)
                    if item is not None]
            missing = sum(record_key(r) not in done for r, _, _ in live)
            bar.update(len(records) - missing)
            if missing:
                yield b, live, missing

    def ask(item):
        b, live, _ = item
        return judge.judge([it for _, it, _ in live], seed=batch_seed(cfg.seed, "judge", b))

    window = batch_window(judge.max_in_flight, cfg.generation.batch_size * cfg.generation.k)
    with JsonlAppender(run.judgements) as out:
        for (_, live, missing), results in ordered_map(ask, todo(), window):
            new = [(r, cut, res) for (r, _, cut), res in zip(live, results, strict=True)
                   if record_key(r) not in done]
            # A backend failure is no verdict: left out, so the next run judges it again.
            lost += sum(res.backend_failed for _, _, res in new)
            records = [_judgement_record(r, judge, res, cut) for r, cut, res in new
                       if not res.backend_failed]
            out.write_all(records)
            bar.update(missing)
            failed += sum(not r["parse_ok"] for r in records)
            tokens += sum(r["completion_tokens"] for r in records)
            bar.set_postfix(parse_failed=failed, backend_failed=lost,
                            tok_s=f"{tokens / (time.perf_counter() - start):.1f}")
    bar.close()
    stats = _token_stats(run.judgements, "judge", "judge")
    stats.update({"judge/backend_failed": lost, "judge/truncated": overlong["truncated"],
                  "judge/skipped_overlong": overlong["skipped"],
                  "time/judge": time.perf_counter() - start})
    stats.update(_backend_stats(getattr(judge, "backend", None), "judge"))
    _write_stats(run, "judge", stats)
    return stats


def _judged_keys(run: RunDir) -> tuple[KeySet, int]:
    """The keys of the judgements already written and how many of them failed to parse."""
    keys, failed = KeySet(), 0
    for _, r in iter_keyed(run.judgements):
        keys.add(record_key(r))
        failed += not r["parse_ok"]
    return keys, failed


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
    a source with its own preferences (data_gen/agreement.py). scores.jsonl is indexed, then
    read prompt by prompt in three streaming passes (pairs, card, agreement)."""
    from data_gen.agreement import source_agreement
    from wim.card import summarize_scores
    from wim.pairs import PairCounts, pair_rows

    start = time.perf_counter()
    scores = RecordIndex(run.scores)
    if not len(scores):
        run.require("scores.jsonl", "wim score")  # the clear error: nothing to pair
    counts = PairCounts()
    write_records_atomic(run.pairs, pair_rows(scores.groups(), cfg.pairs, counts, seed=cfg.seed))
    stats = counts.as_metrics()
    folder = run.file("pairs")
    if save_dataset and counts.pairs:
        _save_dataset(run.pairs, folder)
    cards = _write_cards(cfg, run, summarize_scores(scores.groups(), cfg), stats)
    if save_dataset and counts.pairs and cfg.export.push_to_hub:
        _push(cfg.export.push_to_hub, folder, cards)
    agreement = None
    if cfg.generation.source is not None:
        agreement = source_agreement(cfg, run, scores.groups())
    else:
        run.file("agreement.json").unlink(missing_ok=True)
    if agreement is not None:
        stats["agreement/pairs"] = agreement["pairs"]
        stats["agreement/label_ties"] = agreement["label_ties"]
    stats["time/pairs"] = time.perf_counter() - start
    _write_stats(run, "pairs", stats)
    return stats


def _write_cards(cfg: Config, run: RunDir, summary, counts: dict[str, Any]) -> str:
    """DIR/pairs/README.md (configs: the saved folder's arrow files) and DIR/pairs.README.md
    (configs: pairs.jsonl) for the Hub; returns the card text the Hub gets (its layout)."""
    from wim.card import render_card
    from wim.sources import source_license

    source, license_ = None, None  # the generate stage's stats name the source's shape, sha256
    if cfg.generation.source is not None:
        if run.file("stats/generate.json").is_file():
            source = json.loads(run.file("stats/generate.json").read_text())
        if cfg.card.license is None:
            license_ = source_license(cfg.generation.source, cfg.generation.source_split)
    folder = run.file("pairs")
    folder.mkdir(exist_ok=True)  # the card is written even when there is no pair

    def card(files: str) -> str:
        return render_card(cfg, summary, counts, files, source, license_)

    (folder / "README.md").write_text(card("data-*.arrow"))
    run.file("pairs.README.md").write_text(card("pairs.jsonl"))
    return card("data/train-*")


def _save_dataset(jsonl: Path, folder: Path) -> None:
    """DIR/pairs/ as `Dataset.save_to_disk` writes it, in memory that does not grow with the
    run. datasets' JSON builder writes its Arrow file in batches; `save_to_disk` would then copy
    that file through a memory map of all of it, and the pages it reads stay resident
    (docs/benchmarks.md, "The HTTP driver"). So `save_to_disk` writes the folder of the first
    row alone (its state.json and dataset_info.json, with the whole split's info) and the
    builder's file, in the same Arrow stream format, takes that one-row file's place. More than
    one builder file: the copy."""
    from datasets import load_dataset

    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".pairs-build-") as cache:
        dataset = load_dataset("json", data_files=str(jsonl), split="train", cache_dir=cache)
        files = [Path(f["filename"]) for f in dataset.cache_files]
        if len(files) != 1 or not len(dataset):
            dataset.save_to_disk(str(folder))
            return
        dataset.select([0]).save_to_disk(str(folder))
        del dataset
        (data,) = folder.glob("data-00000-of-00001.arrow")
        os.replace(files[0], data)  # the same file system: a rename


def _push(repo: str, folder: Path, card: str) -> None:
    """The card goes up first: `push_to_hub` then adds its dataset_info and configs to the
    README it finds and keeps our text (datasets 5.2, arrow_dataset.py)."""
    from datasets import load_from_disk
    from huggingface_hub import DatasetCard, HfApi

    HfApi().create_repo(repo, repo_type="dataset", exist_ok=True)
    DatasetCard(card).push_to_hub(repo, repo_type="dataset")
    load_from_disk(str(folder)).push_to_hub(repo)
