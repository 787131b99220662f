"""The generate stage (`wim generate`): k sampled responses per prompt into samples.jsonl, or
with `generation.source` the source's own responses (data_gen/sourced.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

from data_gen import stages
from data_gen.flow import batch_window, ordered_map
from wim.backends import Backend, SamplingParams
from wim.config import Config
from wim.context import fit_messages, token_budget
from wim.holdout import write_split
from wim.pricing import role_price, usage_fields
from wim.prompts import Prompt
from wim.records import JsonlAppender, read_keys
from wim.rundir import RunDir

logger = logging.getLogger(__name__)


def run_stage(cfg: Config, run: RunDir, res: Any, shard: stages.Shard | None, progress: bool,
              fingerprint: str) -> dict[str, Any]:
    # `res`: the run's Resources (data_gen/pipeline.py, which imports this module).
    if cfg.generation.source is not None:  # existing responses: nothing sampled, no policy
        from data_gen.sourced import import_samples

        return import_samples(cfg, run, res, shard, progress)
    write_split(run.path, res.prompts(), res.held_out())
    return generate_samples(cfg, run, res.prompts(), res.policy(), shard, progress)


def generate_samples(cfg: Config, run: RunDir, prompts: list[Prompt], backend: Backend,
                     shard: stages.Shard | None = None, progress: bool = True) -> dict[str, Any]:
    """Sample k responses per prompt, skipping batches already done. A prompt longer than the
    context is cut or skipped; a failed sample is not recorded, so running again retries it."""
    k = cfg.generation.k
    params = SamplingParams(cfg.generation.max_new_tokens, cfg.generation.temperature,
                            cfg.generation.top_p)
    done = read_keys(run.samples)
    batches = stages.prompt_batches(prompts, cfg.generation.batch_size, shard)
    fits = _fit_prompts(cfg, [p for _, batch in batches for p in batch], backend)
    start, new_tokens, failed = time.perf_counter(), 0, 0
    bar = stages.progress_bar(sum(len(b) for _, b in batches) * k, "generate", progress)

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
                                seed=stages.batch_seed(cfg.seed, "generate", b))

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
    stats = stages.token_stats(run.samples, "generate", "policy", role_price(cfg, "policy"))
    stats.update({
        "generate/backend_failed": failed,
        "generate/truncated": sum(truncated for _, truncated in fits.values()),
        "generate/skipped_overlong": sum(msgs is None for msgs, _ in fits.values()),
        "time/generate": time.perf_counter() - start,
    })
    stats.update(stages.backend_stats(backend, "policy"))
    run.write_stats("generate", stats)
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
        "completion_tokens": c.completion_tokens, **usage_fields(c.usage),
    }
    if truncated:  # the policy saw the prompt cut from the middle (messages stay whole)
        record["prompt_truncated"] = True
    return record
