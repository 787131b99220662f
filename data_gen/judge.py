"""The judge stage (`wim judge`): a verdict on every sample into judgements.jsonl, by the judge
the config names (`make_judge`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from data_gen import stages
from data_gen.flow import batch_window, ordered_map
from wim.backends import TransformersBackend, open_backend
from wim.config import Config, judge_http
from wim.judges import BackendJudge, Judge, configured_judge
from wim.pricing import TOKEN_FIELDS, role_price, usage_fields
from wim.prompts import Prompt, PromptRef
from wim.records import JsonlAppender, KeySet, RecordIndex, iter_keyed, record_key
from wim.rundir import SAMPLES, RunDir


def run_stage(cfg: Config, run: RunDir, res: Any, shard: stages.Shard | None, progress: bool,
              fingerprint: str) -> dict[str, Any]:
    # `res`: the run's Resources (data_gen/pipeline.py, which imports this module).
    results = getattr(res, "batch_results", None)  # `wim judge DIR --batch-results OUT...`
    submit = getattr(res, "batch_submit", False)  # `wim judge DIR --batch-submit`
    if cfg.judge.batch or results or submit:
        from data_gen.judge_batch import judge_by_batch

        return judge_by_batch(cfg, run, res, shard, results, submit, judge_batches)
    return judge_samples(cfg, run, res.batch_prompts(), res.judge(), shard, progress)


def make_judge(cfg: Config, policy) -> BackendJudge:
    """The judge for `cfg.judge.role`; `policy` is a callable returning the policy backend."""
    j = cfg.judge
    if j.role == "external" and j.backend == "http":
        http = judge_http(cfg)  # its own endpoint (judge.http), defaulting to the policy's
        backend = open_backend("http", http.model, http)
        name = http.model
    elif j.role == "external":
        backend = open_backend(j.backend, j.model, cfg.http, batch_size=j.batch_size,
                               dtype=j.dtype)
        name = j.model
    else:
        backend = policy()
        name = cfg.policy.model
        if j.role == "fixed" and isinstance(backend, TransformersBackend):
            backend = backend.reference_view(batch_size=j.batch_size)
        elif j.role == "fixed" and cfg.policy.backend == "http" and cfg.policy.adapter:
            # The base model's served name: the frozen reference by construction.
            backend = open_backend("http", cfg.policy.model, cfg.http)
        elif cfg.policy.adapter:
            name = f"{name} + adapter {cfg.policy.adapter}"
    return configured_judge(j, backend, role=j.role, model_name=name)


def judge_samples(cfg: Config, run: RunDir, prompts: Sequence[Prompt | PromptRef], judge: Judge,
                  shard: stages.Shard | None = None, progress: bool = True) -> dict[str, Any]:
    """Judge every sample, several batches in flight when the backend serves many (flow.py)."""
    start = time.perf_counter()
    window = batch_window(judge.max_in_flight, cfg.generation.batch_size * cfg.generation.k)
    lost, counts = judge_batches(cfg, run, prompts, judge, shard, progress, window)
    stats = stages.token_stats(run.judgements, "judge", "judge", role_price(cfg, "judge"))
    stats.update(stages.budget_stats(counts))
    stats.update({"judge/backend_failed": lost, "judge/truncated": counts["truncated"],
                  "judge/skipped_overlong": counts["skipped"],
                  "time/judge": time.perf_counter() - start})
    stats.update(stages.backend_stats(getattr(judge, "backend", None), "judge"))
    run.write_stats("judge", stats)
    return stats


def judge_batches(cfg: Config, run: RunDir, prompts: Sequence[Prompt | PromptRef], judge: Judge,
                  shard: stages.Shard | None, progress: bool, window: int,
                  before: Callable[[list, KeySet, int], None] | None = None
                  ) -> tuple[int, dict[str, int]]:
    """Judge the samples not judged yet, one generation batch at a time, `window` batches in
    flight, written in batch order; a batch's samples are read (by offset) when it runs.
    `before(keys, done, seed)` hears of each judge call (batch files: judge_batch.py).
    Returns the backend failures (not recorded) and the overlong samples' counts, with the
    judgements whose budget ran out before an answer (not recorded either) and the last one's
    message."""
    samples = RecordIndex(run.samples)
    if not len(samples):
        run.require(SAMPLES, "wim generate")  # the clear error: nothing to judge
    done, failed = _judged_keys(run)
    batches = stages.prompt_batches(prompts, cfg.generation.batch_size, shard)
    start, tokens, lost = time.perf_counter(), 0, 0
    bar = stages.progress_bar(
        sum(samples.sample_count(p.id) for _, batch in batches for p in batch), "judge", progress)
    counts: dict = {"truncated": 0, "skipped": 0, "budget_exhausted": 0, "budget_note": ""}

    def todo():  # batches with a sample not judged yet, their samples read as they are needed
        for b, batch in batches:
            records = samples.read(p.id for p in batch)
            fits = judge.fit([(r["prompt"], r["response"]) for r in records],
                             cfg.judge.overlong, cfg.judge.max_input_tokens)
            counts["truncated"] += sum(cut for _, cut in fits)
            counts["skipped"] += sum(item is None for item, _ in fits)
            live = [(r, item, cut) for r, (item, cut) in zip(records, fits, strict=True)
                    if item is not None]
            missing = sum(record_key(r) not in done for r, _, _ in live)
            bar.update(len(records) - missing)
            if missing:
                yield b, live, missing

    def ask(item):
        b, live, _ = item
        seed = stages.batch_seed(cfg.seed, "judge", b)
        if before is not None:
            before([record_key(r) for r, _, _ in live], done, seed)
        return judge.judge([it for _, it, _ in live], seed=seed)

    with JsonlAppender(run.judgements) as out:
        for (_, live, missing), results in ordered_map(ask, todo(), window):
            new = [(r, cut, res) for (r, _, cut), res in zip(live, results, strict=True)
                   if record_key(r) not in done]
            # A backend failure is no verdict: left out, so the next run judges it again; so
            # is a reply that spent the budget before answering (reasoning).
            lost += sum(res.backend_failed for _, _, res in new)
            exhausted = [res for _, _, res in new if res.budget_exhausted]
            if exhausted:
                counts["budget_exhausted"] += len(exhausted)
                counts["budget_note"] = exhausted[-1].error
            records = [_judgement_record(r, judge, res, cut, cfg.judge.keep_reasoning)
                       for r, cut, res in new if not (res.backend_failed or res.budget_exhausted)]
            out.write_all(records)
            bar.update(missing)
            failed += sum(not r["parse_ok"] for r in records)
            tokens += sum(r["completion_tokens"] for r in records)
            bar.set_postfix(parse_failed=failed, backend_failed=lost,
                            **({"budget_exhausted": counts["budget_exhausted"]}
                               if counts["budget_exhausted"] else {}),
                            tok_s=f"{tokens / (time.perf_counter() - start):.1f}")
    bar.close()
    return lost, counts


def _judged_keys(run: RunDir) -> tuple[KeySet, int]:
    """The keys of the judgements already written and how many of them failed to parse."""
    keys, failed = KeySet(), 0
    for _, r in iter_keyed(run.judgements):
        keys.add(record_key(r))
        failed += not r["parse_ok"]
    return keys, failed


def _judgement_record(sample: dict, judge: Judge, res, truncated: bool,
                      keep_reasoning: bool = True) -> dict[str, Any]:
    record = {k: v for k, v in sample.items() if k not in TOKEN_FIELDS}  # the policy's
    record.update(
        judge_role=judge.role, judge_model=judge.model_name, critique=res.critique,
        rating=res.rating, raw_judge_text=res.raw, parse_ok=res.parse_ok,
        parse_error=res.error, attempts=res.attempts, echoed_attempts=res.echoed_attempts,
        prompt_tokens=res.prompt_tokens, completion_tokens=res.completion_tokens,
        **usage_fields(res.usage),
    )
    if truncated:  # the judge saw the prompt cut from the middle (the response whole)
        record["judge_prompt_truncated"] = True
    # Only where the judge reasoned, so a non-reasoning judge's records are as before.
    if res.reasoning and keep_reasoning:
        record["reasoning"] = res.reasoning
    served = getattr(judge, "served_model", None)
    if served:  # which name the server judged by (base model, or a round's adapter)
        record["judge_served_model"] = served
    return record
