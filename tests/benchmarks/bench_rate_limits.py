"""The HTTP driver's rate limits against stand-in servers on 127.0.0.1, scaled down to seconds.

    python tests/benchmarks/bench_rate_limits.py [--repeats N] [--write FILE] [--only TEXT]

Two parts, every arm run `--repeats` times (default 2), the arms in turn, one row per run:
1. Refusals: a server that answers 429 (with Retry-After to its window's end) above 10 requests
   per 1-second window, 40 requests at 8 in flight, no retries. Arms: no budget (the client
   learns the limit from the 429s alone), `requests_per_minute` at the server's limit (600),
   and at 90% of it; and no budget over 200 requests, where the budget the client learns from
   the first pause shows (only that first burst is refused). Printed: the share of attempts
   refused, records lost (must be 0: a 429 pauses the client and costs no record) and wall
   time.
2. `concurrency: auto` beside fixed settings (C: the servers' size; C and 4C, and for the
   batching server C/2 and 2C too), on: 16 slots of a constant 100 ms (480 requests); replicas
   of 6 and 18 slots (720); 16 and 64 slots whose times are lognormal (sigma 0.6); 16 and 64
   slots whose times are proportional to a log-uniform answer length (`usage` says how long);
   and a batching server with no slots whose every decode step slows past a knee of 16 or 64
   in flight (vLLM-like: no queue, no 429), 2,000 requests each. Printed: busy (share of slot
   time serving, first arrival to last end; for the batching server its rate over the best
   fixed arm's rate), replies a second, mean latency (server side) and wall time, each also
   relative to fixed C, and the limit auto settled on (per URL; fixed concurrency goes
   round-robin over the URLs).

The stand-ins are tests/wim/test_rate_limits.py's. Load averages are printed before and after;
the table is printed, and written to FILE with --write. About ten minutes on 2 idle cores.
Not a test: the file name keeps pytest from collecting it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT.parents[1]), str(ROOT.parent / "wim")]  # this checkout's wim, the test
from test_rate_limits import (  # noqa: E402 - the tests' stand-ins
    Batched,
    Slotted,
    StandIn,
    Window,
    by_length,
    log_uniform,
    lognormal_s,
)

from wim.backends.http_client import Failure, HTTPClient  # noqa: E402

WINDOW_N, WINDOW_S, WINDOW_REQUESTS, WINDOW_CONCURRENCY = 10, 1.0, 40, 8
LONG_REQUESTS = 200  # the first burst's refusals against a longer run (the learned budget)
SERVER_RPM = WINDOW_N / WINDOW_S * 60
SERVICE_S = 0.1
N = 2000  # requests against each varying stand-in


def ask(client: HTTPClient, n: int) -> list:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 40}]}
    return client.post_many("/chat/completions", [body] * n)


def refusal_run(settings: dict, n: int = WINDOW_REQUESTS) -> tuple[float, int, float]:
    """One arm against a fresh windowed server: (share of attempts refused, records lost,
    wall seconds)."""
    server = StandIn(Window(n=WINDOW_N, window_s=WINDOW_S))
    client = HTTPClient(server.url, concurrency=WINDOW_CONCURRENCY, max_retries=0, **settings)
    try:
        start = time.perf_counter()
        results = ask(client, n)
        seconds = time.perf_counter() - start
    finally:
        client.close()
        server.close()
    attempts = len(server.answered) + len(server.refused)
    lost = sum(isinstance(r, Failure) for r in results)
    return len(server.refused) / attempts, lost, seconds


def served_run(servers: list, concurrency) -> dict:
    """One arm against fresh stand-ins (one per URL; `Slotted` or `Batched`), `n` requests:
    busy share (slotted), replies a second, mean latency (server side), the limits auto
    settled on, records lost, wall seconds."""
    standins = [StandIn(s) for s in servers]
    client = HTTPClient([s.url for s in standins], concurrency=concurrency, max_retries=0)
    try:
        start = time.perf_counter()
        results = ask(client, servers[0].requests)
        seconds = time.perf_counter() - start
    finally:
        client.close()
        for s in standins:
            s.close()
    spans = [span for s in servers for span in s.spans]
    first = min(a for a, _, _ in spans)
    last = max(e for _, _, e in spans)
    slots = sum(getattr(s, "slots", 0) for s in servers)
    limits = [client.stats[f"url{i}_limit"] for i in range(len(servers))] \
        if concurrency == "auto" else []
    return {"busy": sum(e - s for _, s, e in spans) / (slots * (last - first)) if slots else None,
            "rate": len(spans) / (last - first),
            "latency": sum(e - a for a, _, e in spans) / len(spans),
            "limits": limits, "lost": sum(isinstance(r, Failure) for r in results),
            "seconds": seconds}


def refusals(repeats: int) -> list[str]:
    arms = {"no budget": {},
            f"no budget, {LONG_REQUESTS} requests": {},
            f"requests_per_minute {SERVER_RPM:.0f} (limit)": {"requests_per_minute": SERVER_RPM},
            f"requests_per_minute {0.9 * SERVER_RPM:.0f} (90%)":
                {"requests_per_minute": 0.9 * SERVER_RPM}}
    lines = [f"1. Refusals: 429 + Retry-After above {WINDOW_N} requests per {WINDOW_S:g} s "
             f"window; {WINDOW_REQUESTS} requests, {WINDOW_CONCURRENCY} in flight, no retries",
             f"{'arm':<34} {'run':>3} {'refused':>8} {'lost':>5} {'wall s':>7}"]
    for run in range(1, repeats + 1):
        for arm, settings in arms.items():
            n = LONG_REQUESTS if arm.startswith("no budget,") else WINDOW_REQUESTS
            share, lost, seconds = refusal_run(settings, n)
            lines.append(f"{arm:<34} {run:>3} {share:>8.1%} {lost:>5} {seconds:>7.2f}")
            print(lines[-1], flush=True)
    return lines


def busy_shares(case: str, make, repeats: int) -> list[str]:
    """Auto beside fixed settings on fresh stand-ins from `make()` (a list, one per URL). Slotted
    servers: busy is the share of slot time spent serving, first arrival to last end. A batching
    server has no slots: busy is its rate (replies a second) over the best fixed arm's rate."""
    servers = make()
    size = sum(getattr(s, "slots", 0) or s.knee for s in servers)
    batching = not getattr(servers[0], "slots", 0)
    arms = {"auto": "auto"}
    fixed = (size // 2, size, 2 * size, 4 * size) if batching else (size, 4 * size)
    arms.update({f"fixed {k}" + (" (C)" if k == size else ""): k for k in fixed})
    runs = [(arm, run, served_run(make(), setting))
            for run in range(1, repeats + 1) for arm, setting in arms.items()]
    base = [r for arm, _, r in runs if arms[arm] == size]
    base_latency = sum(r["latency"] for r in base) / len(base)
    base_seconds = sum(r["seconds"] for r in base) / len(base)
    best_rate = max(r["rate"] for arm, _, r in runs if arm != "auto") if batching else None
    lines = [f"2. {case}; {servers[0].requests} requests; latency and wall time relative to "
             f"fixed {size} (C)" + ("; busy = rate / best fixed rate" if batching else ""),
             f"{'arm':<16} {'run':>3} {'busy':>6} {'rate/s':>7} {'lat ms':>7} {'rel':>5} "
             f"{'wall s':>7} {'rel':>5} {'lost':>4}  auto limit"]
    for arm, run, r in runs:
        busy = r["rate"] / best_rate if batching else r["busy"]
        limits = "/".join(str(x) for x in r["limits"]) or "-"
        lines.append(f"{arm:<16} {run:>3} {busy:>6.1%} {r['rate']:>7.1f} "
                     f"{r['latency'] * 1000:>7.1f} {r['latency'] / base_latency:>5.2f} "
                     f"{r['seconds']:>7.2f} {r['seconds'] / base_seconds:>5.2f} {r['lost']:>4}"
                     f"  {limits}")
    print("\n".join(lines), flush=True)
    return lines


def cases() -> dict:
    """The stand-ins of part 2, by name: factories of fresh servers (one per URL), each
    carrying its request count; times scaled down (medians of 50-200 ms)."""
    def slotted(sizes, service, n):
        def make():
            servers = [Slotted(c, service(i)) for i, c in enumerate(sizes)]
            for s in servers:
                s.requests = n
            return servers
        return make

    def batched(knee, step_s, n):
        def make():
            server = Batched(knee, step_s, log_uniform(4, 40, seed=knee))
            server.requests = n
            return [server]
        return make

    return {
        "16 slots of 100 ms (constant)": slotted((16,), lambda i: SERVICE_S, 480),
        "6 + 18 slots of 100 ms on 2 URLs": slotted((6, 18), lambda i: SERVICE_S, 720),
        "16 slots, lognormal median 50 ms sigma 0.6": slotted(
            (16,), lambda i: lognormal_s(0.05, 0.6, seed=i), N),
        "64 slots, lognormal median 200 ms sigma 0.6": slotted(
            (64,), lambda i: lognormal_s(0.2, 0.6, seed=i), N),
        "16 slots, 1 ms a token, 8-120 tokens (log-uniform)": slotted(
            (16,), lambda i: by_length(0.001, 8, 120, seed=i), N),
        "64 slots, 4 ms a token, 8-120 tokens (log-uniform)": slotted(
            (64,), lambda i: by_length(0.004, 8, 120, seed=i), N),
        "batching, knee 16, step 4 ms, 4-40 tokens": batched(16, 0.004, N),
        "batching, knee 64, step 12 ms, 4-40 tokens": batched(64, 0.012, N),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm (default 2)")
    parser.add_argument("--write", type=Path, help="also write the table to this file")
    parser.add_argument("--only", help="only the part-2 cases whose name holds this text")
    args = parser.parse_args()

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = [f"bench_rate_limits.py, {now}",
              f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              f"load average before: {load()}"]
    print("\n".join(header), flush=True)
    start = time.perf_counter()
    table = [*header, ""]
    if args.only is None:
        table += [*refusals(args.repeats), ""]
    for case, make in cases().items():
        if args.only is None or args.only in case:
            table += [*busy_shares(case, make, args.repeats), ""]
    table += [f"load average after: {load()}; {time.perf_counter() - start:.0f} s in all"]
    text = "\n".join(table)
    print("\n" + text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text + "\n")
        print(f"written to {args.write}")


if __name__ == "__main__":
    main()
