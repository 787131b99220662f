"""Judging throughput on the bundled SmolLM2-135M with and without shared-prefix KV reuse.

    python tests/benchmarks/bench_judge.py [--quick] [--prompts N]

The bundled policy first answers N prompts (16, 8 with --quick) x 2 samples (not timed). The
same fixed judge, the quickstart's (wim mode, instructions in the system message, guided
format, batch 32, 32 new tokens, the pipeline's default criteria), then judges every answer
greedily, each of two ways twice, in turn (the faster run of each counts):
- `reuse_prefix=False`: transformers' `generate` on whole prompts;
- `reuse_prefix=True`: the shared instructions are read once per call
  (wim/backends/prefix_cache.py) and `generate` continues each batch from their KV cache
  (reading only the uncached tail).
results/judge_96_float32.txt holds an earlier run that had a third way, a decoding loop of
our own that dropped finished rows; at 1.05x of `generate` on the same cache it was deleted.
Retries are off, so every run judges exactly the same inputs in one greedy pass. Printed:
judgements/s of each, the ratios, and whether the raw judge texts are identical (they must be).
Written to tests/benchmarks/results/judge.txt. Not a test: the file name keeps pytest from
collecting it.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "judge.txt"
SAMPLES = 2
NO_REUSE, REUSE = "reuse_prefix=False", "reuse_prefix=True"
METHODS = {NO_REUSE: {"reuse_prefix": False}, REUSE: {"reuse_prefix": True}}
sys.path[:0] = [str(ROOT.parents[1]), str(ROOT)]  # this checkout's wim, then bench_generation
from bench_generation import load_prompts  # noqa: E402 - the same prompt spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 prompts instead of 16")
    parser.add_argument("--prompts", type=int, default=None, help="number of prompts")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()

    import torch

    from wim.backends import SamplingParams, TransformersBackend
    from wim.config import JudgeConfig
    from wim.judges import BackendJudge
    from wim.models import BUNDLED_POLICY, load_causal_lm

    torch.set_num_threads(args.threads)
    prompts = load_prompts(args.prompts or (8 if args.quick else 16))
    # float32: the two paths must write identical texts (bench_dtype.py measures bfloat16).
    model, tokenizer = load_causal_lm(BUNDLED_POLICY, dtype="float32")
    policy = TransformersBackend(model, tokenizer, batch_size=16)
    convs = [[{"role": "user", "content": p}] for p in prompts]
    answers = policy.generate(convs, SamplingParams(max_new_tokens=64, temperature=0.8,
                                                    top_p=0.95), n=SAMPLES, seed=0)
    items = [(p, c.text) for p, row in zip(prompts, answers, strict=True) for c in row]
    load_start = os.getloadavg()[0]

    runs: dict[str, tuple[float, list, float]] = {}
    outputs: list[list[str]] = []
    # Each setting twice, in turn; the faster run of each counts (other processes on the
    # same cores slow a run down, never speed it up), and every run's texts are compared.
    for method in [*METHODS, *METHODS]:
        backend = TransformersBackend(model, tokenizer, batch_size=32, **METHODS[method])
        judge = BackendJudge(backend, role="fixed", model_name=BUNDLED_POLICY,
                             criteria=JudgeConfig().criteria, max_new_tokens=32, max_retries=0)
        start = time.perf_counter()
        results = judge.judge(items, seed=0)
        seconds = time.perf_counter() - start
        outputs.append([r.raw for r in results])
        if method not in runs or seconds < runs[method][0]:
            runs[method] = (seconds, results, os.getloadavg()[0])
        print(f"  {method}: {len(items)} judgements in {seconds:.1f} s", flush=True)
    same_runs = all(texts == outputs[0] for texts in outputs)

    table = format_table(items, runs, load_start, args.threads)
    table += f"\nall {len(outputs)} runs wrote the same texts: {same_runs}"
    print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(table + "\n")
    print(f"written to {RESULTS.relative_to(ROOT.parents[1])}")


def format_table(items, runs, load_start: float, threads: int) -> str:
    t_off, off, _ = runs[NO_REUSE]
    t_reuse = runs[REUSE][0]
    same = min(sum(a.raw == b.raw for a, b in zip(res, off, strict=True))
               for _, res, _ in runs.values())
    tokens_in = sum(r.prompt_tokens for r in off)
    lines = [
        f"SmolLM2-135M-Instruct as fixed WIM judge, {len(items)} judgements "
        f"({tokens_in} prompt tokens), greedy, guided format, batch 32, <= 32 new tokens",
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch threads "
        f"{threads}, load average {load_start:.2f} at start",
        "",
        f"{'method':<42} {'seconds':>8} {'judgements/s':>13} {'load':>5}",
        *(f"{method:<42} {t:>8.1f} {len(items) / t:>13.2f} {load:>5.2f}"
          for method, (t, _, load) in runs.items()),
        f"speed-up with reuse: {t_off / t_reuse:.2f}x",
        f"identical greedy judgements (every method vs no reuse): {same}/{len(items)} "
        f"({'IDENTICAL' if same == len(items) else 'DIFFERENT'})",
        "parse ok: " + ", ".join(f"{m} {sum(r.parse_ok for r in res)}/{len(items)}"
                                 for m, (_, res, _) in runs.items()),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
