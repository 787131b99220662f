"""The HTTP driver's rate limits against stand-in servers on 127.0.0.1, scaled down to seconds.

    python tests/benchmarks/bench_rate_limits.py [--repeats N] [--write FILE]

Two parts, every arm run `--repeats` times (default 2), the arms in turn, one row per run:
1. Refusals: a server that answers 429 (with Retry-After to its window's end) above 10 requests
   per 1-second window, 40 requests at 8 in flight, no retries. Arms: no budget (the client
   learns the limit from the 429s alone), `requests_per_minute` at the server's limit (600),
   and at 90% of it; and no budget over 200 requests, where the budget the client learns from
   the first pause shows (only that first burst is refused). Printed: the share of attempts
   refused, records lost (must be 0: a 429 pauses the client and costs no record) and wall
   time.
2. Busy share and latency: a server of 16 slots serving each request in 100 ms (the rest
   queue), 480 requests; then two replicas of 6 and 18 slots, 720 requests. Arms:
   `concurrency: auto`, fixed 4, fixed C (the servers' slots together, well set) and fixed 4C.
   Printed: the share of slot time spent serving from the first arrival to the last end, the
   mean latency (arrival to end, server side) over that of fixed C's runs, and the limit auto
   settled on (per URL for the replicas; fixed concurrency goes round-robin over the URLs).

The stand-ins are tests/wim/test_rate_limits.py's. Load averages are printed before and after;
the table is printed, and written to FILE with --write. About two minutes on 2 idle cores.
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
from test_rate_limits import Slotted, StandIn, Window  # noqa: E402 - the tests' stand-ins

from wim.backends.http_client import Failure, HTTPClient  # noqa: E402

WINDOW_N, WINDOW_S, WINDOW_REQUESTS, WINDOW_CONCURRENCY = 10, 1.0, 40, 8
LONG_REQUESTS = 200  # the first burst's refusals against a longer run (the learned budget)
SERVER_RPM = WINDOW_N / WINDOW_S * 60
SERVICE_S = 0.1
SINGLE, SINGLE_REQUESTS = (16,), 480
REPLICAS, REPLICAS_REQUESTS = (6, 18), 720


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


def slotted_run(slots: tuple[int, ...], n: int, concurrency) -> dict:
    """One arm against fresh slotted servers (one per URL): busy share, mean latency, the
    limits auto settled on, records lost, wall seconds."""
    servers = [Slotted(c, SERVICE_S) for c in slots]
    standins = [StandIn(s) for s in servers]
    client = HTTPClient([s.url for s in standins], concurrency=concurrency, max_retries=0)
    try:
        start = time.perf_counter()
        results = ask(client, n)
        seconds = time.perf_counter() - start
    finally:
        client.close()
        for s in standins:
            s.close()
    spans = [span for s in servers for span in s.spans]
    first = min(a for a, _, _ in spans)
    last = max(e for _, _, e in spans)
    served = sum(e - s for _, s, e in spans)
    limits = [client.stats[f"url{i}_limit"] for i in range(len(slots))] \
        if concurrency == "auto" else []
    return {"busy": served / (sum(slots) * (last - first)),
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


def busy_shares(slots: tuple[int, ...], n: int, repeats: int) -> list[str]:
    c = sum(slots)
    arms = {"auto": "auto", "fixed 4": 4, f"fixed {c} (C)": c, f"fixed {4 * c} (4C)": 4 * c}
    size = " + ".join(str(s) for s in slots)
    lines = [f"2. Busy share: {size} slots of {SERVICE_S * 1000:.0f} ms on {len(slots)} URL(s), "
             f"{n} requests; latency relative to fixed {c}",
             f"{'arm':<34} {'run':>3} {'busy':>6} {'lat ms':>7} {'rel':>5} {'lost':>5} "
             f"{'wall s':>7}  auto limit"]
    runs = [(arm, run, slotted_run(slots, n, setting))
            for run in range(1, repeats + 1) for arm, setting in arms.items()]
    base = [r["latency"] for arm, _, r in runs if arms[arm] == c]
    base_latency = sum(base) / len(base)
    for arm, run, r in runs:
        limits = "/".join(str(x) for x in r["limits"]) or "-"
        lines.append(f"{arm:<34} {run:>3} {r['busy']:>6.1%} {r['latency'] * 1000:>7.1f} "
                     f"{r['latency'] / base_latency:>5.2f} {r['lost']:>5} {r['seconds']:>7.2f}"
                     f"  {limits}")
    print("\n".join(lines), flush=True)
    return lines


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
    args = parser.parse_args()

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = [f"bench_rate_limits.py, {now}",
              f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              f"load average before: {load()}"]
    print("\n".join(header), flush=True)
    start = time.perf_counter()
    table = [*header, "", *refusals(args.repeats), ""]
    table += [*busy_shares(SINGLE, SINGLE_REQUESTS, args.repeats), ""]
    table += busy_shares(REPLICAS, REPLICAS_REQUESTS, args.repeats)
    table += ["", f"load average after: {load()}; {time.perf_counter() - start:.0f} s in all"]
    text = "\n".join(table)
    print("\n" + text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text + "\n")
        print(f"written to {args.write}")


if __name__ == "__main__":
    main()
