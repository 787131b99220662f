"""Scoring at fleet speed (issue 35): the embedding paths side by side, first scoring against a
re-score, and what bfloat16 changes, in one run.

    python tests/benchmarks/bench_embed.py [--quick] [--sizes 2000,10000] [--texts 2400]
        [--precision [RUN]] [--no-vllm]

(a) texts/s of each path on the same texts (quickstart-like responses and critiques, seeded):
    in process in float32; in process in bfloat16 where the CPU computes it natively (or on a
    GPU; `--emulated-bf16` times it anyway); over HTTP (`HTTPEmbedder`, /v1/embeddings) to
    vLLM's CPU build serving the bundled MiniLM in pooling mode (tools/vllm_embedding_server.py;
    needs .venv-vllm), and each path's smallest cosine to the float32 vectors;
(b) at each size N prompts x 4 (synthetic judgements, distinct texts): the wall time of the
    first `wim score` (float32, in process) and of re-scores at zeta 0.0 and 1.0, each also as
    the stage's own time (stats/score.json `time/score`: without the CLI's start and imports);
(c) `--precision [RUN]`: on the quickstart's judgements (RUN's judgements.jsonl, or a fresh
    `wim run configs/quickstart.yaml --skip-train` when RUN is not given), scored in float32
    and in bfloat16: the largest similarity difference, how many best-vs-worst pairs change
    (and how many swap chosen and rejected), and the tie rate of each, at each report zeta.
`--quick`: small sizes, to check that the bench works. The machine should be quiet: the load
average is printed at start and end. A full run writes its lines to
tests/benchmarks/results/embed.txt. Not a test: the file name keeps pytest from collecting it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
RESULTS = Path(__file__).resolve().parent / "results" / "embed.txt"
sys.path.insert(0, str(ROOT / "tools"))

WORDS = ("the water light cells energy heat pressure carbon oxygen protein example result "
         "reason effect cause system model answer question history river city bridge law "
         "market price demand supply species climate ocean rock plant animal engine signal "
         "error value number measure rate growth change step method risk safety dose").split()


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def texts(n: int, seed: int = 0) -> list[str]:
    """n texts: responses (40-120 words) and critiques (10-30 words), alternating."""
    rng = random.Random(seed)
    return [sentence(rng, rng.randint(40, 120) if i % 2 == 0 else rng.randint(10, 30))
            for i in range(n)]


def judgements(prompts: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_id": f"p{p}", "sample_idx": k, "prompt": sentence(rng, 12),
             "response": sentence(rng, rng.randint(40, 120)),
             "critique": sentence(rng, rng.randint(10, 30)), "rating": rng.randint(1, 10),
             "parse_ok": True} for p in range(prompts) for k in range(4)]


def machine_lines() -> list[str]:
    import torch

    from wim.precision import machine

    here = machine()
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return [f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}, threads "
            f"{torch.get_num_threads()}; capability {here.cpu_capability}, avx512_bf16 "
            f"{here.avx512_bf16}, amx_tile {here.amx_tile}, cuda {here.cuda}",
            f"load average at start {os.getloadavg()[0]:.2f}"]


def _rate(embedder, batch: list[str]) -> tuple[float, np.ndarray]:
    embedder.embed(batch[:32])  # warm-up (first call pays lazy initialisation)
    if hasattr(embedder, "forget"):
        embedder.forget()
    start = time.perf_counter()
    vectors = embedder.embed(batch)
    return len(batch) / (time.perf_counter() - start), vectors


def embedding_rates(n: int, emulated_bf16: bool, vllm: bool, batch_size: int) -> list[str]:
    from wim.embedders import Embedder, HTTPEmbedder
    from wim.precision import machine

    batch = texts(n)
    lines = [f"(a) texts/s on the same {n} texts (batch {batch_size})"]
    f32_rate, f32 = _rate(Embedder("bundled:all-minilm-l6-v2", batch_size, "float32"), batch)
    lines.append(f"  in process float32      {f32_rate:8.1f} texts/s")
    here = machine()
    if here.native_bf16 or here.cuda or emulated_bf16:
        rate, vec = _rate(Embedder("bundled:all-minilm-l6-v2", batch_size, "bfloat16"), batch)
        note = "" if here.native_bf16 or here.cuda else " (emulated: no native bfloat16 here)"
        lines.append(f"  in process bfloat16     {rate:8.1f} texts/s, smallest cosine to "
                     f"float32 {np.min(np.sum(vec * f32, axis=1)):.6f}{note}")
    else:
        lines.append("  in process bfloat16     not timed: no native bfloat16 on this CPU "
                     "(--emulated-bf16 to time it anyway)")
    if not vllm:
        lines.append("  http, vLLM CPU build    skipped (--no-vllm)")
        return lines
    import vllm_embedding_server as server

    if not server.DEFAULT_PYTHON.exists():
        lines.append(f"  http, vLLM CPU build    skipped: no {server.DEFAULT_PYTHON}")
        return lines
    from wim.models import resolve_embedder

    port = server.free_port()
    log = Path(tempfile.mkdtemp(prefix="bench-embed-")) / "vllm.log"
    proc = server.start(resolve_embedder("bundled:all-minilm-l6-v2"), port, log)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        server.wait_ready(url, proc, log)
        client = HTTPEmbedder(server.SERVED_NAME, [url], batch_size, concurrency=8)
        rate, vec = _rate(client, batch)
        client.close()
        lines.append(f"  http, vLLM CPU build    {rate:8.1f} texts/s, smallest cosine to "
                     f"float32 {np.min(np.sum(vec * f32, axis=1)):.6f} (8 requests in flight; "
                     "server and client share this machine)")
    finally:
        server.stop(proc)
    return lines


def _wim_score(run: Path, *sets: str) -> tuple[float, dict]:
    args = [sys.executable, "-m", "wim", "score", str(run)]
    for item in sets:
        args += ["--set", item]
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"wim score failed:\n{proc.stderr[-3000:]}")
    return wall, json.loads((run / "stats" / "score.json").read_text())


def rescoring(sizes: list[int]) -> list[str]:
    from wim.config import load_config
    from wim.rundir import RunDir

    lines = ["(b) first scoring (float32, in process) against re-scores; wall s (stage s)"]
    for prompts in sizes:
        run = Path(tempfile.mkdtemp(prefix="bench-embed-")) / "run"
        RunDir(run).claim(load_config(QUICKSTART))
        (run / "judgements.jsonl").write_text(
            "".join(json.dumps(j) + "\n" for j in judgements(prompts)))
        first = _wim_score(run, "scoring.dtype=float32", "scoring.zeta=0.4")
        row = [f"  {prompts:>6} x 4  first {first[0]:7.1f} ({first[1]['time/score']:7.1f})"]
        for zeta in (0.0, 1.0):
            again = _wim_score(run, "scoring.dtype=float32", f"scoring.zeta={zeta}")
            assert again[1]["score/similarities_computed"] == 0, again[1]
            stage = again[1]["time/score"] / first[1]["time/score"]
            row.append(f"zeta {zeta:g} {again[0]:5.1f} ({again[1]['time/score']:5.2f}) = "
                       f"{100 * again[0] / first[0]:.1f}% ({100 * stage:.1f}%)")
        lines.append(", ".join(row))
        shutil.rmtree(run.parent, ignore_errors=True)
    return lines


def precision(run: Path | None, quick: bool) -> list[str]:
    import dataclasses

    from data_gen.score import score_run
    from wim.config import load_config
    from wim.metrics import pair_statistics
    from wim.pairs import build_pairs
    from wim.records import read_records
    from wim.rundir import RunDir

    work = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    if run is None:
        run = work / "quickstart"
        extra = ["--set", "prompts.limit=4", "--set", "prompts.holdout=0"] if quick else []
        subprocess.run([sys.executable, "-m", "wim", "run", str(QUICKSTART), "--out", str(run),
                        "--no-progress", "--skip-train", *extra], check=True, cwd=ROOT)
    cfg = load_config(QUICKSTART)
    scored = {}
    for dtype in ("float32", "bfloat16"):
        copy = RunDir(work / dtype)
        copy.claim(cfg)
        shutil.copyfile(run / "judgements.jsonl", copy.judgements)
        one = dataclasses.replace(cfg, scoring=dataclasses.replace(cfg.scoring, dtype=dtype))
        score_run(one, copy)
        scored[dtype] = read_records(copy.scores)
    f32, bf16 = scored["float32"], scored["bfloat16"]
    diffs = [abs(a["similarity"] - b["similarity"]) for a, b in zip(f32, bf16, strict=True)
             if a["similarity"] is not None]
    lines = [f"(c) bfloat16 against float32 on {len(f32)} judgements of {run}",
             f"  largest similarity difference {max(diffs):.6f}, mean {np.mean(diffs):.6f}"]
    tol = cfg.pairs.tie_tolerance
    for zeta in cfg.scoring.report_zetas:
        pairs = {}
        for dtype, records in scored.items():
            rescored = [{**r, "score": None if r["score"] is None else
                         (1 - zeta) * r["rating_norm"] + zeta * (r["similarity"] or 0.0)}
                        for r in records]
            rows, _ = build_pairs(rescored, cfg.pairs, seed=cfg.seed)
            pairs[dtype] = ({r["prompt_id"]: (r["chosen_sample_idx"], r["rejected_sample_idx"])
                             for r in rows},
                            pair_statistics(rescored, zeta, [zeta], tol)[f"zeta/{zeta:g}/tie_rate"])
        a, b = pairs["float32"][0], pairs["bfloat16"][0]
        changed = sum(a.get(p) != b.get(p) for p in set(a) | set(b))
        swapped = sum(p in b and a[p] == b[p][::-1] for p in a)
        lines.append(f"  zeta {zeta:g}: {len(a)} float32 pairs, {changed} change under bfloat16 "
                     f"({swapped} swap chosen and rejected); tie rate float32 "
                     f"{pairs['float32'][1]:.4f}, bfloat16 {pairs['bfloat16'][1]:.4f}")
    shutil.rmtree(work, ignore_errors=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: check the bench")
    parser.add_argument("--sizes", default="2000,10000", help="prompts (x 4) for (b)")
    parser.add_argument("--texts", type=int, default=2400, help="texts for (a)")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per batch / request")
    parser.add_argument("--precision", nargs="?", const="", default=None, metavar="RUN",
                        help="(c) on RUN's judgements, or a fresh quickstart run")
    parser.add_argument("--emulated-bf16", action="store_true",
                        help="time bfloat16 in process even where it is emulated")
    parser.add_argument("--no-vllm", action="store_true", help="skip the HTTP path")
    parser.add_argument("--skip", default="", help="parts to skip: a, b")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where a full run's lines go")
    args = parser.parse_args()
    n_texts = 200 if args.quick else args.texts
    sizes = [25] if args.quick else [int(s) for s in args.sizes.split(",")]
    lines = machine_lines() + [""]
    print("\n".join(lines), flush=True)
    runs = []
    if "a" not in args.skip:
        runs.append(lambda: embedding_rates(n_texts, args.emulated_bf16, not args.no_vllm,
                                            args.batch_size))
    if "b" not in args.skip:
        runs.append(lambda: rescoring(sizes))
    if args.precision is not None:
        runs.append(lambda: precision(Path(args.precision) if args.precision else None,
                                      args.quick))
    for part in runs:
        out = part()
        print("\n".join(out) + "\n", flush=True)
        lines += out + [""]
    lines.append(f"load average at end {os.getloadavg()[0]:.2f}")
    print(lines[-1])
    if not args.quick:
        args.out.write_text("\n".join(lines) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
