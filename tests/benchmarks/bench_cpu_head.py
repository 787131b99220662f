"""TRL's chunked log-probability kernel on this CPU (tile shapes) and ours, float32 and bfloat16.

    python tests/benchmarks/bench_cpu_head.py [--tokens 640] [--threads 1] [--out F]

One forward and backward of `trl.kernels.ChunkedLogProbFunction` (SmolLM2-135M's LM head:
576 x 49152, random weights) over `--tokens` completion tokens, the kernel called on
`token tile` rows at a time with `vocab tile` columns per projection. 4096 x 32768 is TRL's own
tiling (what `add_fused_lm_head` uses); training/cpu_head.py picks its TOKEN_TILE x VOCAB_TILE
from this table. The last row of each dtype is training/cpu_logprobs.py (what cpu_head.py
calls, TOKEN_TILE tokens at a time, VOCAB_TILE columns). Best of two; wall seconds, and the
ratio to TRL's tiling in the same dtype.
Written to `--out` (tests/benchmarks/results/cpu_head.txt).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_head.txt"
TILES = [(4096, 32768), (640, 4096), (512, 4096), (256, 4096), (256, 1024), (128, 2048),
         (64, 4096), (512, 8192)]


OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")


def trl_kernel(vocab_tile: int):
    from trl.kernels import ChunkedLogProbFunction

    return lambda h, w, t: ChunkedLogProbFunction.apply(h, w, None, t, 1.0, vocab_tile, None,
                                                        1.0, OUTPUTS)


def our_kernel(h, w, t):
    from training.cpu_logprobs import completion_log_probs

    return completion_log_probs(h, w, None, t, OUTPUTS)


def fwd_bwd(dtype, tokens: int, token_tile: int, kernel, weight) -> float:
    import torch

    best = float("inf")
    for _ in range(2):
        hidden = torch.randn(tokens, weight.shape[1], dtype=dtype, requires_grad=True)
        targets = torch.randint(0, weight.shape[0], (tokens,))
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            log_probs = torch.cat([kernel(hidden[i:i + token_tile], weight,
                                          targets[i:i + token_tile])[0]
                                   for i in range(0, tokens, token_tile)])
        log_probs.sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=640)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    from training.cpu_head import TOKEN_TILE
    from training.cpu_logprobs import VOCAB_TILE

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weight32 = torch.randn(49152, 576) * 0.02
    lines = [f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, threads "
             f"{args.threads}, capability {torch.backends.cpu.get_cpu_capability()}, "
             f"load {os.getloadavg()[0]:.2f}",
             f"log-probability kernel fwd+bwd, {args.tokens} tokens, LM head 576 x 49152",
             f"{'dtype':<9} {'kernel':<6} {'token tile':>10} {'vocab tile':>10} {'s':>7} "
             f"{'vs TRL':>7}"]
    for dtype in (torch.float32, torch.bfloat16):
        weight = weight32.to(dtype)
        base = None
        rows = [("TRL", t, v, trl_kernel(v)) for t, v in TILES]
        for name, token_tile, vocab_tile, kernel in rows + [("ours", TOKEN_TILE, VOCAB_TILE,
                                                             our_kernel)]:
            s = fwd_bwd(dtype, args.tokens, token_tile, kernel, weight)
            base = base or s
            lines.append(f"{str(dtype)[6:]:<9} {name:<6} {token_tile:>10} {vocab_tile:>10} "
                         f"{s:>7.3f} {s / base:>6.2f}x")
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
