"""One-row decode attention on this CPU: SDPA (as transformers calls it) against ours.

    python tests/benchmarks/bench_decode_attention.py [--threads 2] [--out F]

SmolLM2-135M's attention heads (9 query heads over 3 key/value heads, head size 64), one query
row per sequence against `kv` cached positions, the last 10 masked as padding. "sdpa" is
`torch.nn.functional.scaled_dot_product_attention` on the query heads packed per key/value
head, as transformers 5.24's `sdpa_attention_forward` calls it for one-row steps; "ours" is
wim/backends/decode_attention.py's `decode_attention_forward`. Median of 50 calls after two
warm-up calls, milliseconds, and ours / sdpa in the same dtype. Also the largest difference of
the outputs. Written to `--out` (tests/benchmarks/results/decode_attention.txt).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "decode_attention.txt"
sys.path.insert(0, str(ROOT.parents[1]))  # this checkout's wim
#: (rows, cached positions): a judge batch after its shared prefix, a generation batch, a long
#: context with few rows, a long context with a full batch.
SHAPES = [(32, 310), (32, 120), (8, 600), (32, 1100)]


def _median_ms(call, repeats: int = 50) -> float:
    call(), call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _time_shape(module, dtype, rows: int, kv: int) -> tuple[float, float, float]:
    """(SDPA ms, ours ms, largest output difference) at one shape."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from wim.backends.decode_attention import decode_attention_forward

    query = torch.randn(rows, 9, 1, 64, dtype=dtype)
    key, value = (torch.randn(rows, 3, kv, 64, dtype=dtype) for _ in range(2))
    mask = torch.ones(rows, 1, 1, kv, dtype=torch.bool)
    mask[..., -10:] = False

    def sdpa():
        return sdpa_attention_forward(module, query, key, value, mask)[0]

    def ours():
        return decode_attention_forward(module, query, key, value, mask)[0]

    diff = float((ours().float() - sdpa().float()).abs().max())
    return _median_ms(sdpa), _median_ms(ours), diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    lines = [f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, threads "
             f"{args.threads}, capability {torch.backends.cpu.get_cpu_capability()}, "
             f"load {os.getloadavg()[0]:.2f}",
             "one-row decode attention, 9 query heads / 3 key-value heads x 64",
             f"{'dtype':<9} {'rows':>5} {'kv':>5} {'sdpa ms':>8} {'ours ms':>8} {'ratio':>6} "
             f"{'max diff':>9}"]
    for dtype in (torch.float32, torch.bfloat16):
        for rows, kv in SHAPES:
            base, mine, diff = _time_shape(module, dtype, rows, kv)
            lines.append(f"{str(dtype)[6:]:<9} {rows:>5} {kv:>5} {base:>8.3f} {mine:>8.3f} "
                         f"{mine / base:>5.2f}x {diff:>9.2g}")
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
