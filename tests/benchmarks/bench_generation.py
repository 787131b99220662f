"""Generation throughput on the bundled SmolLM2-135M: naive loop vs our backends, one run.

    python tests/benchmarks/bench_generation.py [--quick] [--llama-build NAME=DIR ...]

32 prompts (8 with --quick) x 4 samples x up to 64 new tokens, sampling at temperature 0.8:
(a) the naive loop, one prompt at a time, `model.generate(num_return_sequences=1)` 4 times;
(b) `TransformersBackend` with batch sizes 8 and 16, n=4 per call;
(c) `LlamaCppBackend` (when llama-cpp-python is installed), and the same with each other build
    of llama-cpp-python given as `--llama-build NAME=DIR`, DIR holding its `llama_cpp` package
    (e.g. `pip install --no-deps --target DIR llama-cpp-python==0.3.36` under other CMAKE_ARGS);
    each build runs in its own process, and the table names the CPU features it was built with;
(d) a vLLM server (the CPU build in .venv-vllm, `make install-vllm`; skipped without it) on the
    bundled model's folder, through `HTTPBackend` (8 requests in flight, n=4 per request), its
    start-up not timed. `--no-vllm` leaves it out.
Throughput counts the tokens actually generated (up to and including EOS), never padding.
The table is printed and written to tests/benchmarks/results/generation.txt. Not a test: the
file name keeps pytest from collecting it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "wim" / "data" / "prompts.jsonl"
RESULTS = Path(__file__).resolve().parent / "results" / "generation.txt"
SAMPLES = 4
MAX_NEW_TOKENS = 64
TEMPERATURE = 0.8

FALLBACK_PROMPTS = [
    "Explain why ice floats on water.",
    "Why is the sky blue during the day but red at sunset?",
    "How do vaccines train the immune system?",
    "What causes the seasons on Earth?",
    "Summarise the causes of the French Revolution.",
    "Why did the Roman Empire split in two?",
    "What was the significance of the printing press?",
    "Describe the main effects of the Industrial Revolution.",
    "Write a Python function that reverses a linked list.",
    "Explain the difference between a list and a tuple in Python.",
    "What is a race condition and how do you avoid one?",
    "How does a hash table handle collisions?",
    "Is it ever right to break a promise?",
    "What is the trolley problem and why does it matter?",
    "Should animals have legal rights?",
    "Is lying to protect someone's feelings acceptable?",
    "How should I prepare for a job interview?",
    "Give me tips for sleeping better.",
    "How can I save money on groceries?",
    "What is a good way to learn a new language?",
    "Write a short poem about the sea.",
    "Describe a city on Mars in the year 2200.",
    "Write the opening line of a mystery novel.",
    "Invent a new holiday and describe how it is celebrated.",
    "What is compound interest?",
    "Explain inflation to a ten-year-old.",
    "Should I pay off debt or invest first?",
    "What is an index fund?",
    "How does the heart pump blood?",
    "What are the benefits of regular exercise?",
    "Why do we need vitamin D?",
    "What is the difference between a virus and a bacterium?",
]


def load_prompts(count: int) -> list[str]:
    """`count` prompts spread over the domains of wim/data/prompts.jsonl (else the fallback)."""
    if PROMPTS.exists():
        rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
        prompts = [row["prompt"] for row in rows]
    else:
        prompts = FALLBACK_PROMPTS
    step = max(1, len(prompts) // count)  # the file is grouped by domain: take every step-th
    return (prompts[::step] + prompts)[:count]


def timed(run: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = run()
    return time.perf_counter() - start, tokens


def naive_loop(model, tokenizer, convs) -> int:
    import torch

    from wim.backends.transformers_backend import (  # the same count as TransformersBackend
        TransformersBackend,
        _count_generated,
    )

    torch.manual_seed(0)
    tokens = 0
    for conv in convs:
        text = tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        for _ in range(SAMPLES):
            with torch.inference_mode():
                out = model.generate(
                    **enc,
                    max_new_tokens=MAX_NEW_TOKENS,
                    do_sample=True,
                    temperature=TEMPERATURE,
                    top_p=1.0,
                    num_return_sequences=1,
                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                )
            tokens += _count_generated(out[0, enc.input_ids.shape[1] :],
                                       TransformersBackend(model, tokenizer).end_ids(),
                                       tokenizer.pad_token_id)
    return tokens


def backend_run(backend, convs, params) -> int:
    results = backend.generate(convs, params, n=SAMPLES, seed=0)
    assert all(c.ok for row in results for c in row), "a completion failed"
    return sum(c.completion_tokens for row in results for c in row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 prompts instead of 32")
    parser.add_argument("--llama-build", action="append", default=[], metavar="NAME=DIR",
                        help="also time the llama-cpp-python build installed in DIR")
    parser.add_argument("--no-vllm", action="store_true", help="leave out the vLLM server")
    parser.add_argument("--llama-only", type=int, help=argparse.SUPPRESS)  # the subprocess
    args = parser.parse_args()
    if args.llama_only:
        print(json.dumps(llama_run(args.llama_only)))
        return

    import torch

    from wim.backends import SamplingParams, TransformersBackend
    from wim.models import BUNDLED_POLICY, load_causal_lm

    torch.set_num_threads(2)
    prompts = load_prompts(8 if args.quick else 32)
    convs = [[{"role": "user", "content": p}] for p in prompts]
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=TEMPERATURE)
    load_start = os.getloadavg()[0]

    model, tokenizer = load_causal_lm(BUNDLED_POLICY, dtype="float32")  # bench_dtype: bf16
    warm = TransformersBackend(model, tokenizer, batch_size=2)
    warm.generate(convs[:2], SamplingParams(max_new_tokens=4), n=2)  # first-call overheads

    rows: list[tuple[str, float, int, float]] = []
    features: list[str] = []

    def record(label: str, run: Callable[[], int]) -> None:
        seconds, tokens = timed(run)
        # Other processes on the same cores slow everything (2 threads stall each other when
        # one is descheduled): the load average after each row shows which rows were hit.
        rows.append((label, seconds, tokens, os.getloadavg()[0]))
        print(f"  {label}: {tokens} tokens in {seconds:.1f} s", flush=True)

    record("naive loop (batch 1, n=1 x 4)", lambda: naive_loop(model, tokenizer, convs))
    for batch_size in (8, 16):
        backend = TransformersBackend(model, tokenizer, batch_size=batch_size)
        record(
            f"TransformersBackend bs={batch_size}, n=4",
            lambda b=backend: backend_run(b, convs, params),
        )
    builds = [("installed", None), *(b.split("=", 1) for b in args.llama_build)]
    for name, folder in builds:
        result = llama_in_subprocess(folder, len(prompts))
        if "error" in result:
            print(f"  skipping llama.cpp ({name}): {result['error']}")
            continue
        rows.append((f"LlamaCppBackend {name}", result["seconds"], result["tokens"],
                     os.getloadavg()[0]))
        features.append(f"llama.cpp {name}: {result['features']}")
        print(f"  {rows[-1][0]}: {result['tokens']} tokens in {result['seconds']:.1f} s",
              flush=True)

    if not args.no_vllm:
        result = vllm_run(convs, params)
        if "error" in result:
            print(f"  skipping the vLLM server: {result['error']}")
        else:
            rows.append(("vLLM server (HTTP, n=4)", result["seconds"], result["tokens"],
                         os.getloadavg()[0]))
            print(f"  {rows[-1][0]}: {result['tokens']} tokens in {result['seconds']:.1f} s",
                  flush=True)

    table = format_table(rows, len(prompts), load_start, os.getloadavg()[0])
    table += "".join(f"\n{line}" for line in features)
    print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(table + "\n")
    print(f"written to {RESULTS.relative_to(ROOT)}")


def llama_in_subprocess(folder: str | None, n_prompts: int) -> dict:
    """`llama_run` in a fresh process whose `llama_cpp` is the build in `folder` (None: the
    installed one): two builds cannot share one process, and a crash stays in its own."""
    env, cwd = dict(os.environ), None
    if folder:
        env["PYTHONPATH"] = os.pathsep.join([folder, env.get("PYTHONPATH", "")])
        # A GGML_BACKEND_DL build keeps its CPU variants in bin/; ggml looks for them next to
        # the Python executable (where a venv install puts them) or in the working directory.
        if Path(folder, "bin").is_dir():
            cwd = str(Path(folder, "bin"))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--llama-only",
                           str(n_prompts)], env=env, cwd=cwd, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def llama_run(n_prompts: int) -> dict:
    """Time `LlamaCppBackend` on the benchmark's prompts with this process's llama_cpp."""
    try:
        import llama_cpp

        from wim.backends import SamplingParams
        from wim.backends.llama_cpp_backend import LlamaCppBackend
        from wim.models import BUNDLED_POLICY
    except ImportError as exc:
        return {"error": str(exc)}
    convs = [[{"role": "user", "content": p}] for p in load_prompts(n_prompts)]
    llama = LlamaCppBackend.load(BUNDLED_POLICY, n_threads=2)
    llama.generate(convs[:1], SamplingParams(max_new_tokens=4))
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, temperature=TEMPERATURE)
    seconds, tokens = timed(lambda: backend_run(llama, convs, params))
    llama.close()
    info = llama_cpp.llama_print_system_info().decode()
    # "CPU : SSE3 = 1 | AVX = 1 | ..." -> "SSE3 AVX ..."
    flags = [f.split(":")[-1].split("=")[0].strip() for f in info.split("|")
             if f.strip().endswith("= 1")]
    return {"seconds": seconds, "tokens": tokens, "features": " ".join(flags)}


def vllm_run(convs, params) -> dict:
    """Start a vLLM server on the bundled model's folder (tools/vllm_server.py), warm it up,
    time `HTTPBackend` on the benchmark's prompts, stop it."""
    import tempfile

    sys.path.insert(0, str(ROOT / "tools"))
    import vllm_server as launcher

    from wim.backends.http_backend import HTTPBackend
    from wim.models import BUNDLED_POLICY, resolve_causal_lm

    if not launcher.DEFAULT_PYTHON.exists():
        return {"error": f"no {launcher.DEFAULT_PYTHON} (make install-vllm)"}
    port = launcher.free_port()
    log = Path(tempfile.mkdtemp()) / "vllm.log"
    proc = launcher.start(launcher.DEFAULT_PYTHON, resolve_causal_lm(BUNDLED_POLICY), port, log)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        launcher.wait_ready(url, proc, log)
        backend = HTTPBackend([url], launcher.SERVED_NAME, concurrency=8, timeout_s=300)
        backend.generate(convs[:2], params.__class__(max_new_tokens=4), n=2)  # warm-up
        seconds, tokens = timed(lambda: backend_run(backend, convs, params))
        backend.close()
    except RuntimeError as exc:
        return {"error": str(exc)[-300:]}
    finally:
        launcher.stop(proc)
    return {"seconds": seconds, "tokens": tokens}


def format_table(rows, n_prompts: int, load_start: float, load_end: float) -> str:
    naive_rate = rows[0][2] / rows[0][1]
    batched = [r for r in rows if r[0].startswith("TransformersBackend")]
    best = max(batched, key=lambda r: r[2] / r[1])
    lines = [
        f"SmolLM2-135M-Instruct, {n_prompts} prompts x {SAMPLES} samples x <= {MAX_NEW_TOKENS} "
        f"new tokens, temperature {TEMPERATURE}",
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch threads 2, "
        f"load average {load_start:.2f} at start, {load_end:.2f} at end",
        "",
        f"{'method':<34} {'seconds':>8} {'tokens':>7} {'tok/s':>7} {'x naive':>8} {'load':>5}",
    ]
    for label, seconds, tokens, load in rows:
        rate = tokens / seconds
        lines.append(
            f"{label:<34} {seconds:>8.1f} {tokens:>7d} {rate:>7.1f} {rate / naive_rate:>7.2f}x"
            f" {load:>5.2f}"
        )
    rate = best[2] / best[1]
    lines.append(f"best batched: {best[0]} at {rate:.1f} tok/s, {rate / naive_rate:.2f}x naive")
    for label, seconds, tokens, _ in rows:
        if label.startswith(("LlamaCppBackend", "vLLM")):
            lines.append(f"{label}: {tokens / seconds / rate:.2f}x the best batched "
                         "TransformersBackend")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
