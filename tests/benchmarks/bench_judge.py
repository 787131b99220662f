"""Judging throughput on the bundled SmolLM2-135M with and without shared-prefix KV reuse.

    python tests/benchmarks/bench_judge.py [--quick] [--prompts N]

The bundled policy first answers N prompts (16, 8 with --quick) x 2 samples (not timed). The
same fixed judge, the quickstart's (wim mode, instructions in the system message, guided
format, batch 32, 32 new tokens, the pipeline's default criteria), then judges every answer
greedily, each way twice, alternating (the faster run of each counts):
`reuse_prefix=True` reads the shared instructions once per call (wim/backends/prefix_cache.py)
and decodes each batch from their KV cache, finished rows leaving the batch
(wim/backends/decode.py); `reuse_prefix=False` is transformers' `generate` on whole prompts.
Retries are off, so every run judges exactly the same inputs in one greedy pass. Printed:
judgements/s of each, the ratio, and whether the raw judge texts are identical (they must be).
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

    runs: dict[bool, tuple[float, list, float]] = {}
    outputs: dict[bool, list[list[str]]] = {True: [], False: []}
    # Each setting twice, alternating; the faster run of each counts (other processes on the
    # same cores slow a run down, never speed it up), and every run's texts are compared.
    for reuse in (True, False, True, False):
        backend = TransformersBackend(model, tokenizer, batch_size=32, reuse_prefix=reuse)
        judge = BackendJudge(backend, role="fixed", model_name=BUNDLED_POLICY,
                             criteria=JudgeConfig().criteria, max_new_tokens=32, max_retries=0)
        start = time.perf_counter()
        results = judge.judge(items, seed=0)
        seconds = time.perf_counter() - start
        outputs[reuse].append([r.raw for r in results])
        if reuse not in runs or seconds < runs[reuse][0]:
            runs[reuse] = (seconds, results, os.getloadavg()[0])
        print(f"  reuse_prefix={reuse}: {len(items)} judgements in {seconds:.1f} s", flush=True)
    same_runs = all(texts == outputs[False][0] for texts in outputs[True] + outputs[False])

    table = format_table(items, runs, load_start, args.threads)
    table += f"\nall four runs wrote the same texts: {same_runs}"
    print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(table + "\n")
    print(f"written to {RESULTS.relative_to(ROOT.parents[1])}")


def format_table(items, runs, load_start: float, threads: int) -> str:
    (t_on, on, load_on), (t_off, off, load_off) = runs[True], runs[False]
    same = sum(a.raw == b.raw for a, b in zip(on, off, strict=True))
    tokens_in = sum(r.prompt_tokens for r in off)
    lines = [
        f"SmolLM2-135M-Instruct as fixed WIM judge, {len(items)} judgements "
        f"({tokens_in} prompt tokens), greedy, guided format, batch 32, <= 32 new tokens",
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch threads "
        f"{threads}, load average {load_start:.2f} at start",
        "",
        f"{'method':<30} {'seconds':>8} {'judgements/s':>13} {'load':>5}",
        f"{'reuse_prefix=False':<30} {t_off:>8.1f} {len(items) / t_off:>13.2f} {load_off:>5.2f}",
        f"{'reuse_prefix=True':<30} {t_on:>8.1f} {len(items) / t_on:>13.2f} {load_on:>5.2f}",
        f"speed-up with reuse: {t_off / t_on:.2f}x",
        f"identical greedy judgements: {same}/{len(items)} "
        f"({'IDENTICAL' if same == len(items) else 'DIFFERENT'})",
        f"parse ok: reuse {sum(r.parse_ok for r in on)}/{len(items)}, "
        f"no reuse {sum(r.parse_ok for r in off)}/{len(items)}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
