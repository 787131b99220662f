"""float32 against bfloat16 on this CPU, side by side in one process: sampling, judging, DPO.

    python tests/benchmarks/bench_dtype.py --pairs RUN/pairs.jsonl [--prompts 16] [--steps 30]
                                           [--ref-steps 10] [--threads 2] [--parts ...] [--out F]

- generation: the bundled SmolLM2-135M through `TransformersBackend`, N prompts x 2 samples x
  64 new tokens, T 0.8, top-p 0.95, batch 16 (the quickstart's settings); tok/s.
- judging: the quickstart's fixed judge (wim mode, guided format, batch 32, <= 32 new tokens,
  greedy, no retries) on the float32 answers; judgements/s, and the share of the judgements
  whose raw text is identical in both dtypes.
- DPO: `training.train.train_dpo_model` with the quickstart's DPO and LoRA settings on the pairs of
  a quickstart run, `--steps` steps in each dtype (float32 weights; bfloat16: mixed precision,
  float32 LoRA weights); wall seconds of the whole call, s/step and the loss curves.
- DPO's reference pass (`--ref-steps` steps each): TRL's per-step reference forward (the
  adapter switched off, every step) against `precompute_ref_log_probs` (one pass over the pairs
  before training), in each dtype; wall seconds and the largest loss difference per step.
- gemm: the matrix products of a quickstart DPO step (912 tokens through SmolLM2-135M's
  projections and MLP, 512 completion tokens through the LM head) in each dtype, GFLOP/s and
  the bfloat16 / float32 time ratio: the floor under a DPO step's own ratio, whose time is
  mostly these products.
- attention (`--attn-steps` steps each): DPO with SDPA throughout against what
  training/cpu_attention.py picks (eager for bfloat16 on a CPU), in each dtype, alternating,
  twice; wall seconds of the training loop (`train/seconds`).
- patches (`--attn-steps` steps each): DPO with all our CPU patches against TRL's log-prob
  kernel at the same tiles instead of training/cpu_logprobs.py; in turn, twice.

Each generation and judging setting runs twice, alternating; the faster run counts (other
processes on the same cores slow a run down, never speed it up). Beside wall seconds, the CPU
seconds this process got (`time.process_time`, both threads): on a shared machine they move
far less with the load than wall time does. On a CPU without native bfloat16 (no AMX, no
AVX512-BF16) the benchmark says so and times float32 only. `--parts` picks some of generate,
judge, dpo, ref, attn, step, gemm (generate, judge, dpo, ref by default). Written to `--out`
(the recorded runs: tests/benchmarks/results/dtype_*.txt). Not a test: the file name keeps
pytest from collecting it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "dtype.txt"
QUICKSTART = ROOT.parents[1] / "configs" / "quickstart.yaml"
sys.path[:0] = [str(ROOT.parents[1]), str(ROOT)]  # this checkout's wim, then bench_generation
from bench_generation import load_prompts  # noqa: E402 - the same prompt spread

_OURS: dict = {}  # our functions, kept while an arm swaps them out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=Path, help="a quickstart run's pairs.jsonl (dpo, ref)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts to sample (x 2)")
    parser.add_argument("--steps", type=int, default=30, help="DPO steps per dtype")
    parser.add_argument("--ref-steps", type=int, default=10,
                        help="DPO steps per reference-pass variant (0: skip)")
    parser.add_argument("--attn-steps", type=int, default=10, help="attn: DPO steps per run")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--parts", default="generate,judge,dpo,ref",
                        help="what to time: generate, judge, dpo, ref, attn, patches, step, gemm")
    parser.add_argument("--step-rows", type=int, default=8, help="step: sequences per batch")
    parser.add_argument("--step-length", type=int, default=192, help="step: tokens each")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the table goes")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if parts & {"dpo", "ref", "attn", "patches"} and args.pairs is None:
        parser.error("dpo, ref, attn and patches need --pairs RUN/pairs.jsonl")
    # precompute_ref_log_probs caches its pass in the datasets cache: a private one, emptied
    # before every training, so no run reads another's reference log-probs.
    cache = Path(tempfile.mkdtemp(prefix="bench-dtype-"))
    os.environ["HF_DATASETS_CACHE"] = str(cache)

    import torch

    from wim.precision import machine

    torch.set_num_threads(args.threads)
    here = machine()
    dtypes = ["float32", "bfloat16"] if here.native_bf16 else ["float32"]
    lines = [f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
             f"{torch.__version__}, threads {args.threads}; torch capability "
             f"{here.cpu_capability}, avx512_bf16 {here.avx512_bf16}, amx_tile {here.amx_tile}",
             f"load average at start {os.getloadavg()[0]:.2f}", ""]
    if not here.native_bf16:
        lines += ["This CPU has no native bfloat16 (no AMX, no AVX512-BF16): bfloat16 would be "
                  "emulated and slower, so `auto` is float32 here and only float32 is timed.", ""]
    if parts & {"generate", "judge"}:
        answers, sampling = time_generation(dtypes, args.prompts)
        lines += sampling + [""]
    if "judge" in parts:
        lines += time_judging(dtypes, answers) + [""]
    if "dpo" in parts:
        lines += time_dpo(dtypes, args.pairs, args.steps, cache) + [""]
    if "ref" in parts:
        lines += time_reference_pass(dtypes, args.pairs, args.ref_steps, cache)
    if "patches" in parts:
        lines += time_patches(dtypes, args.pairs, args.attn_steps, cache) + [""]
    if "attn" in parts:
        lines += time_attention(dtypes, args.pairs, args.attn_steps, cache) + [""]
    if "step" in parts:
        lines += time_step(dtypes, args.step_rows, args.step_length, 2) + [""]
    if "gemm" in parts:
        lines += time_gemms(dtypes) + [""]
    lines.append(f"load average at end {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    shutil.rmtree(cache, ignore_errors=True)
    print(f"written to {args.out}")


def _backend(dtype: str, batch_size: int):
    from wim.backends import TransformersBackend
    from wim.models import BUNDLED_POLICY

    return TransformersBackend.load(BUNDLED_POLICY, batch_size=batch_size, dtype=dtype)


def _best_of_two(dtypes: list[str], run, rounds: int = 2
                 ) -> dict[str, tuple[float, object, float, float]]:
    """{dtype: (seconds, result, load average, CPU seconds)} of the faster of alternating runs
    (the least CPU seconds of them kept apart)."""
    best: dict[str, tuple[float, object, float, float]] = {}
    cpu: dict[str, float] = {}
    for dtype in dtypes * rounds:
        start, cpu_start = time.perf_counter(), time.process_time()
        result = run(dtype)
        seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        print(f"  {run.__name__} {dtype}: {seconds:.1f} s wall, {cpu_s:.1f} s CPU", flush=True)
        cpu[dtype] = min(cpu.get(dtype, cpu_s), cpu_s)
        if dtype not in best or seconds < best[dtype][0]:
            best[dtype] = (seconds, result, os.getloadavg()[0], 0.0)
    return {d: (*v[:3], cpu[d]) for d, v in best.items()}


def time_generation(dtypes: list[str], n_prompts: int):
    from wim.backends import SamplingParams

    backends = {d: _backend(d, 16) for d in dtypes}
    convs = [[{"role": "user", "content": p}] for p in load_prompts(n_prompts)]
    params = SamplingParams(max_new_tokens=64, temperature=0.8, top_p=0.95)

    def generate(dtype: str):
        return backends[dtype].generate(convs, params, n=2, seed=0)

    best = _best_of_two(dtypes, generate)
    lines = [f"generation: {n_prompts} prompts x 2 samples x <= 64 tokens, T 0.8, batch 16",
             f"{'dtype':<10} {'seconds':>8} {'tokens':>7} {'tok/s':>7} {'CPU s':>7} "
             f"{'tok/CPU s':>9} {'load':>5}"]
    rate, cpu_rate = {}, {}
    for dtype, (seconds, results, load, cpu_s) in best.items():
        tokens = sum(c.completion_tokens for row in results for c in row)
        rate[dtype], cpu_rate[dtype] = tokens / seconds, tokens / cpu_s
        lines.append(f"{dtype:<10} {seconds:>8.1f} {tokens:>7} {rate[dtype]:>7.1f} "
                     f"{cpu_s:>7.1f} {cpu_rate[dtype]:>9.1f} {load:>5.2f}")
    if len(rate) == 2:
        lines.append(f"bfloat16 / float32 tok/s: {rate['bfloat16'] / rate['float32']:.2f}x wall, "
                     f"{cpu_rate['bfloat16'] / cpu_rate['float32']:.2f}x per CPU second")
    answers = [(conv[0]["content"], c.text) for conv, row in
               zip(convs, best["float32"][1], strict=True) for c in row]
    return answers, lines


def time_judging(dtypes: list[str], items: list[tuple[str, str]]) -> list[str]:
    from wim.config import JudgeConfig
    from wim.judges import BackendJudge
    from wim.models import BUNDLED_POLICY

    judges = {d: BackendJudge(_backend(d, 32), role="fixed", model_name=BUNDLED_POLICY,
                              criteria=JudgeConfig().criteria, max_new_tokens=32, max_retries=0)
              for d in dtypes}

    def judge(dtype: str):
        return judges[dtype].judge(items, seed=0)

    best = _best_of_two(dtypes, judge)
    lines = [f"judging: {len(items)} judgements, fixed judge, wim mode, guided, greedy, batch 32",
             f"{'dtype':<10} {'seconds':>8} {'judgements/s':>13} {'CPU s':>7} {'parse ok':>9} "
             f"{'load':>5}"]
    for dtype, (seconds, results, load, cpu_s) in best.items():
        ok = sum(r.parse_ok for r in results)
        lines.append(f"{dtype:<10} {seconds:>8.1f} {len(items) / seconds:>13.2f} {cpu_s:>7.1f} "
                     f"{ok:>5}/{len(items):<3} {load:>5.2f}")
    if len(best) == 2:
        f32, b16 = best["float32"][1], best["bfloat16"][1]
        same = sum(a.raw == b.raw for a, b in zip(f32, b16, strict=True))
        rating = sum(a.rating == b.rating for a, b in zip(f32, b16, strict=True))
        speed = best["float32"][0] / best["bfloat16"][0]
        cpu_speed = best["float32"][3] / best["bfloat16"][3]
        lines += [f"bfloat16 / float32 judgements/s: {speed:.2f}x wall, {cpu_speed:.2f}x per "
                  "CPU second",
                  f"identical greedy judgements (raw text): {same}/{len(items)} "
                  f"({same / len(items):.0%}); same rating: {rating}/{len(items)}"]
    return lines


def _train(dtype: str, pairs: Path, steps: int, cache: Path, reference_pass: str,
           attention: str = "auto", without: str = "") -> dict:
    """One `train_dpo_model` on the pairs; returns its metrics, loss curve and wall seconds.
    attention "sdpa": training keeps SDPA (training/cpu_attention.py switched off).
    without "cpu_logprobs": TRL's log-probability kernel
    (`ChunkedLogProbFunction`) at the same tiles in place of training/cpu_logprobs.py."""
    import contextlib
    import json

    import training.cpu_logprobs
    import training.train
    from training.cpu_attention import training_attention
    from training.train import train_dpo_model
    from wim.config import load_config

    training.train.training_attention = (training_attention if attention == "auto" else
                                         lambda model, max_length: contextlib.nullcontext("sdpa"))
    ours = _OURS.setdefault("log_probs", training.cpu_logprobs.completion_log_probs)
    training.cpu_logprobs.completion_log_probs = (
        _trl_log_probs if without == "cpu_logprobs" else ours)

    for child in cache.iterdir():
        shutil.rmtree(child, ignore_errors=True)
    overrides = [f"policy.dtype={dtype}", f"dpo.max_steps={steps}", "dpo.save_steps=0",
                 f"dpo.reference_pass={reference_pass}"]
    cfg = load_config(QUICKSTART, overrides)
    with tempfile.TemporaryDirectory() as out:
        start, cpu_start = time.perf_counter(), time.process_time()
        metrics, _ = train_dpo_model(cfg, pairs, out, progress=False)
        seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        history = json.loads((Path(out) / "log_history.json").read_text())
    losses = [h["loss"] for h in history if "loss" in h]
    print(f"  DPO {dtype} reference_pass={reference_pass}: {seconds:.1f} s wall, {cpu_s:.1f} s CPU",
          flush=True)
    return {"metrics": metrics, "losses": losses, "seconds": seconds, "cpu": cpu_s,
            "load": os.getloadavg()[0]}


def _trl_log_probs(hidden, weight, bias, targets, outputs):
    """TRL's kernel with the arguments and tiles of training/cpu_logprobs.py's."""
    from trl.kernels import ChunkedLogProbFunction

    from training.cpu_logprobs import VOCAB_TILE

    return ChunkedLogProbFunction.apply(hidden, weight, bias, targets, 1.0, VOCAB_TILE, None, 1.0,
                                        tuple(o for o in outputs if o != "log_probs"))


def time_patches(dtypes: list[str], pairs: Path, steps: int, cache: Path) -> list[str]:
    """Whole DPO steps with each of our CPU patches against the library's own path, in turn,
    twice: training loop seconds (`train/seconds`, reference precomputed)."""
    arms = {"ours": "", "TRL's log-prob kernel": "cpu_logprobs"}
    lines = [f"DPO patches, {steps} steps each, reference precomputed: training loop seconds "
             "(train/seconds), each arm twice in turn; ratio = ours / without (best of two)",
             f"{'dtype':<10} {'arm':<26} {'run 1':>7} {'run 2':>7} {'ours/arm':>9} {'load':>5}"]
    for dtype in dtypes:
        runs: dict[str, list[dict]] = {a: [] for a in arms}
        for _ in range(2):
            for arm, without in arms.items():
                runs[arm].append(_train(dtype, pairs, steps, cache, "precompute",
                                        without=without))
        best = {a: min(r["metrics"]["train/seconds"] for r in rs) for a, rs in runs.items()}
        for arm, rs in runs.items():
            times = [r["metrics"]["train/seconds"] for r in rs]
            lines.append(f"{dtype:<10} {arm:<26} {times[0]:>7.1f} {times[1]:>7.1f} "
                         f"{best['ours'] / best[arm]:>9.2f} {rs[-1]['load']:>5.2f}")
    return lines


def time_dpo(dtypes: list[str], pairs: Path, steps: int, cache: Path) -> list[str]:
    runs = {d: _train(d, pairs, steps, cache, "auto") for d in dtypes}
    n_pairs = sum(1 for line in pairs.open() if line.strip())
    lines = [f"DPO: {n_pairs} quickstart pairs ({pairs}), {steps} steps, batch 4, max_length "
             "192, LoRA r 8 on q_proj/v_proj, dpo.reference_pass auto",
             f"{'dtype':<10} {'wall s':>7} {'s/step':>7} {'CPU s':>7} {'loss first':>10} "
             f"{'loss last':>9} {'min':>6} {'load':>5}"]
    for dtype, r in runs.items():
        m = r["metrics"]
        lines.append(f"{dtype:<10} {r['seconds']:>7.1f} {r['seconds'] / steps:>7.2f} "
                     f"{r['cpu']:>7.1f} {m['train/loss_first']:>10.4f} "
                     f"{m['train/loss_last']:>9.4f} {min(r['losses']):>6.3f} {r['load']:>5.2f}")
    if len(runs) == 2:
        b16, f32 = runs["bfloat16"], runs["float32"]
        lines.append(f"bfloat16 / float32 seconds: {b16['seconds'] / f32['seconds']:.2f}x wall, "
                     f"{b16['cpu'] / f32['cpu']:.2f}x CPU")
    for dtype, r in runs.items():
        lines.append(f"loss curve {dtype}: " + " ".join(f"{x:.3f}" for x in r["losses"]))
    return lines


def time_attention(dtypes: list[str], pairs: Path, steps: int, cache: Path) -> list[str]:
    lines = [f"DPO attention, {steps} steps each, reference precomputed: SDPA throughout vs "
             "training/cpu_attention.py's pick; training loop seconds (train/seconds), twice",
             f"{'dtype':<10} {'picked':>7} {'SDPA s':>13} {'picked s':>13} {'ratio':>6}"]
    for dtype in dtypes:
        runs: dict[str, list[dict]] = {"sdpa": [], "auto": []}
        for _ in range(2):
            for attention in runs:
                runs[attention].append(_train(dtype, pairs, steps, cache, "precompute",
                                              attention))
        sdpa = [r["metrics"]["train/seconds"] for r in runs["sdpa"]]
        auto = [r["metrics"]["train/seconds"] for r in runs["auto"]]
        picked = runs["auto"][0]["metrics"]["train/attention"]
        lines.append(f"{dtype:<10} {picked:>7} {sdpa[0]:>6.1f} {sdpa[1]:>6.1f} "
                     f"{auto[0]:>6.1f} {auto[1]:>6.1f} {min(auto) / min(sdpa):>6.2f}")
    return lines


def time_reference_pass(dtypes: list[str], pairs: Path, steps: int, cache: Path) -> list[str]:
    lines = [f"DPO reference pass, {steps} steps each: per-step forward with the adapter off "
             "vs TRL's precompute_ref_log_probs (one pass before training)",
             f"{'dtype':<10} {'per-step s':>10} {'precompute s':>12} {'ratio':>6} "
             f"{'CPU ratio':>9} {'max |loss diff|':>16}"]
    for dtype in dtypes:
        per_step = _train(dtype, pairs, steps, cache, "per_step")
        pre = _train(dtype, pairs, steps, cache, "precompute")
        diff = max(abs(a - b) for a, b in zip(per_step["losses"], pre["losses"], strict=True))
        lines.append(f"{dtype:<10} {per_step['seconds']:>10.1f} {pre['seconds']:>12.1f} "
                     f"{pre['seconds'] / per_step['seconds']:>6.2f} "
                     f"{pre['cpu'] / per_step['cpu']:>9.2f} {diff:>16.2e}")
    return lines



def time_step(dtypes: list[str], rows: int, length: int, repeats: int) -> list[str]:
    """One DPO step's arithmetic without TRL around it: a LoRA forward+backward of `rows`
    sequences (chosen and rejected) and the reference forward with the adapter off, in float32
    and in bfloat16 as training runs it (bfloat16 base, float32 LoRA, autocast)."""
    import contextlib

    import torch
    from peft import get_peft_model

    from training.train import lora_config
    from wim.config import load_config
    from wim.models import BUNDLED_POLICY, load_causal_lm

    cfg = load_config(QUICKSTART)
    models = {d: get_peft_model(load_causal_lm(BUNDLED_POLICY, dtype=d)[0], lora_config(cfg))
              for d in dtypes}
    ids = torch.randint(100, 40000, (rows, length), generator=torch.Generator().manual_seed(0))

    def autocast(dtype: str):
        return (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16"
                else contextlib.nullcontext())

    def step(dtype: str):
        model = models[dtype]
        model.train()
        with autocast(dtype):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad()
        return float(loss)

    def reference(dtype: str):
        model = models[dtype]
        with torch.no_grad(), model.disable_adapter(), autocast(dtype):
            return float(model(input_ids=ids, labels=ids).loss)

    lines = [f"one step's arithmetic: {rows} x {length} tokens, LoRA r 8 q/v, best of {repeats}",
             f"{'dtype':<10} {'fwd+bwd s':>9} {'CPU s':>7} {'ref fwd s':>9} {'CPU s':>7} "
             f"{'loss':>7} {'lora':>8}"]
    train = _best_of_two(dtypes, step, repeats)
    ref = _best_of_two(dtypes, reference, repeats)
    for d in dtypes:
        lora = next(p.dtype for n, p in models[d].named_parameters() if "lora_" in n)
        lines.append(f"{d:<10} {train[d][0]:>9.2f} {train[d][3]:>7.2f} {ref[d][0]:>9.2f} "
                     f"{ref[d][3]:>7.2f} {train[d][1]:>7.4f} {str(lora)[6:]:>8}")
    if len(dtypes) == 2:
        wall = train["bfloat16"][0] / train["float32"][0]
        cpu = train["bfloat16"][3] / train["float32"][3]
        lines.append(f"bfloat16 / float32: fwd+bwd {wall:.2f}x wall, {cpu:.2f}x CPU; ref fwd "
                     f"{ref['bfloat16'][0] / ref['float32'][0]:.2f}x wall, "
                     f"{ref['bfloat16'][3] / ref['float32'][3]:.2f}x CPU")
    for d in dtypes:
        lines.append(f"{d}: the reference forward is {ref[d][3] / (ref[d][3] + train[d][3]):.0%}"
                     " of a step's CPU time (policy fwd+bwd plus reference fwd)")
    return lines


#: (tokens, inputs, outputs) of the products in a quickstart DPO step (torch profiler): q/o
#: projections, MLP up/gate and down (forward, and the backward's input gradients), an LM-head
#: tile of training/cpu_logprobs.py and its hidden-state gradient over the whole vocabulary.
STEP_GEMMS = [(912, 576, 576), (912, 576, 1536), (912, 1536, 576), (512, 576, 4096),
              (512, 49152, 576)]


def time_gemms(dtypes: list[str], repeats: int = 20) -> list[str]:
    """Median time of each product in each dtype; GFLOP/s and bfloat16 / float32."""
    import statistics

    import torch

    lines = [f"matrix products of a DPO step, median of {repeats}",
             f"{'tokens x in x out':<20} " + " ".join(f"{d + ' GFLOP/s':>17}" for d in dtypes)
             + ("  bf16/f32" if len(dtypes) == 2 else "")]
    for tokens, k, n in STEP_GEMMS:
        seconds = {}
        for d in dtypes:
            a = torch.randn(tokens, k, dtype=getattr(torch, d))
            b = torch.randn(k, n, dtype=getattr(torch, d))
            torch.mm(a, b)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                torch.mm(a, b)
                times.append(time.perf_counter() - start)
            seconds[d] = statistics.median(times)
        row = f"{f'{tokens} x {k} x {n}':<20} " + " ".join(
            f"{2 * tokens * k * n / seconds[d] / 1e9:>17.0f}" for d in dtypes)
        if len(dtypes) == 2:
            row += f"  {seconds['bfloat16'] / seconds['float32']:>8.2f}x"
        lines.append(row)
        print(row, flush=True)
    return lines


if __name__ == "__main__":
    main()
