"""Run by test_online_loss.py under `torch.distributed.run` (2 CPU processes, gloo): a tiny
model built in place, wrapped in DDP, trained through `KeptPairMean` as WimOnlineDPOTrainer does.
Each rank saves its reduced gradients per case to OUT/rank<r>.pt.

Not a test module (no test_ prefix): `pairs_for` is also imported by the test, which recomputes
the expected gradient in one process from the same pairs.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import zlib

import torch

BETA = 0.5
DIM = 6
# case -> rank -> micro-batches, each the keep mask of 3 pairs
CASES = {
    "rank1_drops_all": {0: [[True, False, True]], 1: [[False, False, False]]},
    "accumulated": {0: [[True, False, True], [False, False, False]],
                    1: [[False, True, False], [True, True, False]]},
    "none_kept": {0: [[False, False, False]], 1: [[False, False, False]]},
}


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 4), torch.nn.Tanh(),
                               torch.nn.Linear(4, 1)).double()


def pairs_for(case: str, rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chosen and rejected inputs of 3 pairs, fixed by (case, rank, micro-batch)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{rank}/{micro}".encode()))
    return (torch.randn(3, DIM, generator=g, dtype=torch.float64),
            torch.randn(3, DIM, generator=g, dtype=torch.float64))


def pair_losses(model, chosen, rejected) -> torch.Tensor:
    """Per-pair loss through the trainer's own `sigmoid_losses` (reference logprobs 0)."""
    from training.online_trainer import sigmoid_losses

    zero = torch.zeros(len(chosen), dtype=torch.float64)
    return sigmoid_losses(BETA, model(chosen).squeeze(1), model(rejected).squeeze(1), zero, zero)


def main(out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from training.online_trainer import KeptPairMean

    # A stuck connection or collective raises here within a minute instead of running into the
    # test's timeout with nothing said.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    saved = {}
    for case, masks in CASES.items():
        model = DistributedDataParallel(tiny_model())
        kept_mean, steps = KeptPairMean(), len(masks[rank])
        for micro, keep in enumerate(masks[rank]):
            chosen, rejected = pairs_for(case, rank, micro)
            losses = pair_losses(model, chosen, rejected)
            loss = kept_mean.micro_batch_loss(losses, torch.tensor(keep))
            last = micro == steps - 1
            with contextlib.nullcontext() if last else model.no_sync():
                (loss / steps).backward()  # accelerate's backward divides by the steps
        step_loss = kept_mean.finish(model.parameters(), steps, torch.device("cpu"))
        saved[case] = {"loss": step_loss,
                       "grads": [None if p.grad is None else p.grad.clone()
                                 for p in model.module.parameters()]}
    torch.save(saved, f"{out}/rank{rank}.pt")
    dist.barrier()
    # Leave without tearing the process group down. In torch 2.13, freeing the last DDP model
    # destroys gloo's process group with the GIL held and joins its worker thread, which may still
    # need the GIL to free its last work: a deadlock at exit, about one run in ten here (py-spy:
    # ~ProcessGroupGloo -> std::thread::join against gil_scoped_acquire in runLoop).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
