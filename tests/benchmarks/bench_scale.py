"""Dataset-sized runs (issue 32): the HTTP driver's rate and CPU, the utilization of a server
with a fixed number of slots, and the memory and time per stage of a sourced run, one run.

    python tests/benchmarks/bench_scale.py [--quick] [--fast-embedder] [--sizes 10000,100000]
                                           [--cpus 2]

The servers are tests/benchmarks/standin_server.js (Node's plain `http`, a canned ~2 KB chat
completion, in a process of its own; node 18+ on PATH), so the driver, not the server, is
measured; the bench first says what that server does alone with tests/benchmarks/
load_client.js, a minimal Node client (keep-alive, 32 in flight). Everything runs on `--cpus`
CPUs (2 by default: the driver and the server share them, as the issue's targets assume).
(a) requests/s of the driver (`HTTPBackend`, wim/backends/http_client.py) against the instant
    server, `--concurrency` in flight: one `generate` call over all conversations, and batches
    through data_gen/flow.ordered_map as the stages run them;
(b) the driver's CPU seconds per 1,000 requests (this process, all its threads);
(c) utilization of a stand-in that serves at most C=64 requests at once, each for a lognormal
    time (median 1 s, sigma 0.6), the rest waiting: busy slot-seconds / (C x wall), wall from
    its first request's start to its last one's end. Driven through ordered_map over batches
    of 64 requests (16 prompts x 4), and through the real `wim judge` of a sourced run;
(d) a sourced run (`wim run --skip-train`, `generation.source` = an UltraFeedback-shaped
    parquet of N prompts x 4 completions that the bench writes, `judge.backend: http` on the
    instant server) at each size: seconds per stage (from the CLI's "stage X" log lines),
    peak RSS per stage (VmRSS sampled every 0.1 s) and of the whole run (the kernel's peak of
    the process), report.html's size. `--fast-embedder` embeds with the instant server's
    32-dimensional hashing vectors (`scoring.backend: http`, `/v1/embeddings`) instead of
    MiniLM, so that the figure shows our overhead, not MiniLM's.
`--quick`: small sizes, to check the bench works in about a minute. On a busy machine every
figure is low and noisy: the figures to quote come from a quiet one. A full run writes its
tables to tests/benchmarks/results/scale.txt. Not a test: the file name keeps pytest from
collecting it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CONFIG = ROOT / "configs" / "ultrafeedback_source.yaml"
RESULTS = HERE / "results" / "scale.txt"
SLOTS, MEDIAN_S, SIGMA = 64, 1.0, 0.6
K = 4  # completions per prompt, as UltraFeedback


# -- servers --------------------------------------------------------------------------------

class Standin:
    """tests/benchmarks/standin_server.js in a process of its own (see its header)."""

    def __init__(self, slots: int = 0, median_s: float = MEDIAN_S, sigma: float = SIGMA) -> None:
        if shutil.which("node") is None:
            sys.exit("bench_scale needs node (v18 or later) on PATH for its stand-in server")
        self.proc = subprocess.Popen(
            ["node", str(HERE / "standin_server.js"), "0", str(slots), str(median_s),
             str(sigma), "1"], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("ready "):
            sys.exit(f"the stand-in server did not start: {line!r}")
        self.root = f"http://127.0.0.1:{line.split()[1]}"
        self.url = self.root + "/v1"

    def stats(self) -> dict:
        with urllib.request.urlopen(self.root + "/stats", timeout=10) as reply:
            return json.loads(reply.read())

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self.root + "/reset", method="POST"),
                               timeout=10).read()

    def utilization(self) -> float:
        s = self.stats()
        return s["busy_s"] / (SLOTS * (s["last_end"] - s["first_start"]))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def server_alone(server: Standin, requests: int) -> dict:
    """The instant server with the minimal Node client: what it serves when nothing else
    costs anything."""
    out = subprocess.run(["node", str(HERE / "load_client.js"),
                          server.url + "/chat/completions", str(requests), "32"],
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    return {"rate": got["requests"] / got["seconds"],
            "client_cpu_per_1000": 1000 * got["cpu_s"] / got["requests"]}


# -- the driver -----------------------------------------------------------------------------

def _conversations(n: int) -> list[list[dict]]:
    """Judge-sized requests: a system rubric and a question with a ~700-character answer."""
    rubric = "Say what is missing from the answer, then rate it from 1 to 10. " * 6
    answer = "Sunlight scatters off the molecules of the air, blue light most of all. " * 10
    return [[{"role": "system", "content": rubric},
             {"role": "user", "content": f"Question {i}: why is the sky blue?\n\nAnswer: "
                                         f"{answer}"}] for i in range(n)]


def driver_rate(url: str, requests: int, concurrency: int, per_batch: int) -> dict:
    """(a) and (b): one generate call, then batches through ordered_map."""
    from data_gen.flow import batch_window, ordered_map
    from wim.backends import SamplingParams
    from wim.backends.http_backend import HTTPBackend

    params = SamplingParams(max_new_tokens=128, temperature=0.0)
    convs = _conversations(requests)
    backend = HTTPBackend([url], "judge", concurrency=concurrency)
    out = {}
    try:
        backend.generate(convs[:200], params)  # connections open, code warm
        for mode in ("one call", "ordered_map"):
            wall, cpu = time.perf_counter(), time.process_time()
            if mode == "one call":
                results = backend.generate(convs, params)
            else:
                batches = [convs[i : i + per_batch] for i in range(0, requests, per_batch)]
                window = batch_window(backend.max_in_flight, per_batch)
                results = [c for _, r in ordered_map(lambda b: backend.generate(b, params),
                                                     batches, window) for c in r]
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert len(results) == requests and all(c.ok for [c] in results), "failed requests"
            out[mode] = {"rate": requests / wall, "cpu_per_1000": 1000 * cpu / requests}
    finally:
        backend.close()
    return out


def utilization_flow(server: Standin, requests: int, per_batch: int) -> float:
    """(c) through ordered_map over batches, as the judge stage sends them."""
    from data_gen.flow import batch_window, ordered_map
    from wim.backends import SamplingParams
    from wim.backends.http_backend import HTTPBackend

    params = SamplingParams(max_new_tokens=128, temperature=0.0)
    convs = _conversations(requests)
    batches = [convs[i : i + per_batch] for i in range(0, requests, per_batch)]
    backend = HTTPBackend([server.url], "judge", concurrency=SLOTS, timeout_s=120)
    server.reset()
    try:
        window = batch_window(backend.max_in_flight, per_batch)
        done = sum(len(r) for _, r in ordered_map(lambda b: backend.generate(b, params),
                                                  batches, window))
    finally:
        backend.close()
    assert done == requests
    return server.utilization()


def ideal_utilization(requests: int, repeats: int = 20) -> float:
    """What a driver that never lets a slot wait gets from the same stand-in, simulated (same
    distribution, other draws): below 100% only by the drain at the end, when the last
    requests finish one by one."""
    import heapq
    import math

    rng = random.Random(0)
    total = 0.0
    for _ in range(repeats):
        ends = [0.0] * SLOTS
        busy = 0.0
        for _ in range(requests):  # first come first served on the slot free first
            start = heapq.heappop(ends)
            seconds = MEDIAN_S * math.exp(SIGMA * rng.gauss(0, 1))
            busy += seconds
            heapq.heappush(ends, start + seconds)
        total += busy / (SLOTS * max(ends))
    return total / repeats


# -- sourced runs ---------------------------------------------------------------------------

_WORDS = ("the a model answer light water energy because which system method result "
          "value first second change example people time process data reason cell heat "
          "market policy effect cost risk step code list table rate form level").split()


def write_source(path: Path, prompts: int, seed: int = 0) -> None:
    """An UltraFeedback-shaped parquet: `instruction`, `models`, and `completions` (model,
    response of 300-1,500 characters, overall_score), written 5,000 rows at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    models = ["gpt-4", "llama-2-70b-chat", "wizardlm-13b", "falcon-40b-instruct"]
    writer = None
    try:
        for start in range(0, prompts, 5000):
            rows = []
            for i in range(start, min(prompts, start + 5000)):
                completions = [{"model": m, "overall_score": float(rng.randint(1, 10)),
                                "response": " ".join(rng.choices(_WORDS,
                                                                 k=rng.randint(50, 250)))}
                               for m in models]
                rows.append({"source": "bench", "instruction": f"Prompt {i}: " + " ".join(
                    rng.choices(_WORDS, k=rng.randint(8, 60))) + "?",
                    "models": models, "completions": completions})
            table = pa.Table.from_pylist(rows)
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def run_overrides(source: Path, judge_url: str, instant_url: str, fast_embedder: bool,
                  concurrency: int) -> list[str]:
    sets = [f"generation.source={source}", "generation.source_shape=ultrafeedback",
            "generation.batch_size=16", "prompts.holdout=0",
            "judge.role=external", "judge.backend=http", "judge.model=judge",
            f"http.base_urls=[{instant_url}]", "http.model=judge",
            f"http.concurrency={concurrency}", "http.timeout_s=120",
            f"judge.http.base_urls=[{judge_url}]"]
    if judge_url != instant_url:
        sets.append(f"judge.http.concurrency={SLOTS}")
    if fast_embedder:
        sets += ["scoring.backend=http", "scoring.http.model=hash"]
    return [a for s in sets for a in ("--set", s)]


def _rss_mb(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match[1]) / 1024 if match else 0.0


def timed_run(args: list[str], out: Path) -> dict:
    """`wim ARGS` in a subprocess: seconds and peak RSS (MB) per stage, peak RSS overall."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "wim", *args, "--no-progress"], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    marks: list[tuple[str, float]] = [("start-up", time.perf_counter())]
    tail: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            tail.append(line)
            del tail[:-40]
            stage = re.match(r"INFO data_gen\.pipeline: stage (\w+)$", line.strip())
            if stage:
                marks.append((stage[1], time.perf_counter()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peaks: dict[str, float] = {}
    while True:  # os.wait4, not Popen.poll: it gives the child's own peak RSS
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        stage = marks[-1][0]
        peaks[stage] = max(peaks.get(stage, 0.0), _rss_mb(proc.pid))
        time.sleep(0.1)
    end = time.perf_counter()
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join(10)
    if proc.returncode:
        sys.exit(f"wim {' '.join(args)} failed:\n{''.join(tail)}")
    bounds = [t for _, t in marks[1:]] + [end]
    stages = {name: {"s": bounds[i] - t, "rss_mb": peaks.get(name, 0.0)}
              for i, (name, t) in enumerate(marks)}
    peak = usage.ru_maxrss / 1024  # kB on Linux
    report = out / "report.html"
    return {"stages": stages, "wall_s": end - marks[0][1], "peak_rss_mb": peak,
            "report_mb": report.stat().st_size / 2**20 if report.exists() else None}


# -- printing -------------------------------------------------------------------------------

def print_tables(alone: dict, driver: dict, util: dict, runs: dict, concurrency: int) -> None:
    print(f"Instant server alone (Node, minimal Node client, 32 in flight): "
          f"{alone['rate']:,.0f} requests/s")
    print(f"Driver against it, {concurrency} in flight (HTTPBackend on aiohttp):")
    print(f"  {'mode':<14}{'requests/s':>12}{'CPU s / 1,000 requests':>26}")
    for mode, d in driver.items():
        print(f"  {mode:<14}{d['rate']:>12,.0f}{d['cpu_per_1000']:>26.3f}")
    print(f"Utilization of the C={SLOTS} stand-in (lognormal, median {MEDIAN_S} s, "
          f"sigma {SIGMA}):")
    for mode, u in util.items():
        print(f"  {mode:<44}{100 * u:>6.1f}%")
    if not runs:
        return
    print("Sourced runs (wim run --skip-train, judge over HTTP on the instant server):")
    stages = [s for s in ("start-up", "generate", "judge", "score", "pairs", "report")
              if any(s in r["stages"] for r in runs.values())]
    head = f"  {'N x 4':<12}{'wall s':>8}{'peak RSS MB':>13}{'report MB':>11}"
    head += "".join(f"{s + ' s/MB':>18}" for s in stages)
    print(head)
    for size, r in runs.items():
        line = (f"  {size:<12,}{r['wall_s']:>8.1f}{r['peak_rss_mb']:>13.0f}"
                f"{(r['report_mb'] or 0):>11.2f}")
        for s in stages:
            got = r["stages"].get(s)
            cell = "-" if got is None else "{:.1f} / {:.0f}".format(got["s"], got["rss_mb"])
            line += f"{cell:>18}"
        print(line)
        judge = r["stages"].get("judge")
        if judge:
            print(f"  {'':<12}judge: {size * K / judge['s']:,.0f} judgements/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument("--fast-embedder", action="store_true",
                        help="hashing vectors from the instant server instead of MiniLM")
    parser.add_argument("--sizes", default=None,
                        help="prompts of the sourced runs, comma-separated (10000,100000)")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests of the driver's rate (20000; --quick 3000)")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="requests in flight against the instant server")
    parser.add_argument("--cpus", type=int, default=2,
                        help="run everything (driver, servers, wim) on this many CPUs (2: the "
                             "issue's targets are for 2 cores; 0: all)")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args()
    if args.cpus and hasattr(os, "sched_setaffinity"):  # children inherit it
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cpus])
    quick = args.quick
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else [200, 1000] if quick else [10_000, 100_000])
    requests = args.requests or (3000 if quick else 20_000)
    util_requests = 256 if quick else 2000  # 2,000: the 500 x 4
    util_prompts = util_requests // K

    work = Path(tempfile.mkdtemp(prefix="bench_scale_"))
    instant, slots = Standin(), Standin(slots=SLOTS)
    try:
        alone = server_alone(instant, requests)
        print(f"server alone: {alone['rate']:,.0f}/s", flush=True)
        driver = driver_rate(instant.url, requests, args.concurrency, per_batch=16 * K)
        print(f"driver: {driver}", flush=True)
        util = {f"an ideal driver (simulated), {util_requests} requests":
                ideal_utilization(util_requests),
                f"ordered_map, batches of {16 * K}, {util_requests} requests":
                utilization_flow(slots, util_requests, per_batch=16 * K)}
        print(f"utilization: {util}", flush=True)
        # The real judge stage: import the source, then `wim judge` alone on the slot server.
        source = work / "util.parquet"
        write_source(source, util_prompts, seed=1)
        out = work / "util_run"
        sets = run_overrides(source, slots.url, instant.url, args.fast_embedder,
                             args.concurrency)
        timed_run(["generate", str(CONFIG), "--out", str(out), *sets], out)
        slots.reset()
        timed_run(["judge", str(out)], out)
        util[f"wim judge, {util_prompts} x {K} sourced"] = slots.utilization()
        print(f"utilization: {util}", flush=True)
        runs = {}
        for size in sizes:
            source = work / f"source_{size}.parquet"
            write_source(source, size)
            out = work / f"run_{size}"
            sets = run_overrides(source, instant.url, instant.url, args.fast_embedder,
                                 args.concurrency)
            runs[size] = timed_run(["run", str(CONFIG), "--out", str(out), "--skip-train",
                                    *sets], out)
            print(f"{size} x {K}: {runs[size]}", flush=True)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
                source.unlink()
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
            print(f"bench_scale.py{' --quick' if quick else ''}"
                  f"{' --fast-embedder' if args.fast_embedder else ''}: on {cpus} of "
                  f"{os.cpu_count()} CPUs, "
                  f"{platform.processor() or platform.machine()}, load average "
                  f"{os.getloadavg()[0]:.1f} at the end")
            print_tables(alone, driver, util, runs, args.concurrency)
        print("\n" + buffer.getvalue(), end="")
        if not quick:
            RESULTS.parent.mkdir(exist_ok=True)
            RESULTS.write_text(buffer.getvalue())
            print(f"written to {RESULTS.relative_to(ROOT)}")
    finally:
        instant.close()
        slots.close()
        if args.keep:
            print(f"run directories kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
