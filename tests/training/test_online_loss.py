"""The online trainer's pair rule and loss, without a language model: which side is chosen, and
that the loss is the mean over the kept pairs of a step on every rank (2 gloo processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT

from training.online import choose_pair

TOL = 0.5  # on the 1-10 scale: scores 0.1 apart (0.5 points) tie, 0.2 apart do not


def test_choose_pair_follows_the_tolerance_not_an_exact_comparison() -> None:
    # A near-tie whose second completion is slightly higher: still the first, under `first`
    # (an exact comparison, TRL's, would pick the second) ...
    assert choose_pair(0.3, 0.4, TOL, "first") == (True, True, True)
    # ... and out of the loss under `drop`.
    assert choose_pair(0.3, 0.4, TOL, "drop") == (True, False, True)
    # Beyond the tolerance the higher score wins, either side.
    assert choose_pair(0.3, 0.5, TOL, "drop") == (False, True, False)
    assert choose_pair(0.5, 0.3, TOL, "first") == (True, True, False)
    # A failed judgement: no verdict, dropped whatever the tie policy.
    assert choose_pair(None, 0.9, TOL, "first") == (True, False, False)
    assert choose_pair(0.9, None, TOL, "first")[1] is False


def test_missing_or_misshaped_pair_choice_raises() -> None:
    import torch

    from training.online_trainer import KeptPairMean, PairChoice, WimOnlineDPOTrainer

    def trainer_with(choice):
        return SimpleNamespace(reward_funcs=[SimpleNamespace(take_choice=lambda: choice)])

    cpu = torch.device("cpu")
    with pytest.raises(RuntimeError, match="no pair choice"):
        WimOnlineDPOTrainer._take_choice(trainer_with(None), 2, cpu)
    with pytest.raises(RuntimeError, match="the batch has 2"):
        WimOnlineDPOTrainer._take_choice(trainer_with(PairChoice([True], [True])), 2, cpu)
    first, keep = WimOnlineDPOTrainer._take_choice(
        trainer_with(PairChoice([True, False], [False, True])), 2, cpu)
    assert first.tolist() == [True, False] and keep.tolist() == [False, True]
    with pytest.raises(RuntimeError, match="keep mask must be bool of shape"):
        KeptPairMean().micro_batch_loss(torch.ones(3), torch.ones(2, dtype=torch.bool))


def expected(case: str):
    """Loss and gradient of the mean over every kept pair of the case, in one process."""
    import torch
    from ddp_kept_mean import CASES, pair_losses, pairs_for, tiny_model

    model = tiny_model()
    kept = []
    for rank, masks in CASES[case].items():
        for micro, keep in enumerate(masks):
            losses = pair_losses(model, *pairs_for(case, rank, micro))
            kept += [losses[i] for i, k in enumerate(keep) if k]
    loss = torch.stack(kept).mean()
    loss.backward()
    return float(loss.detach()), [p.grad for p in model.parameters()]


def test_two_ranks_one_dropping_everything_train_on_the_other_ranks_mean(tmp_path: Path
                                                                          ) -> None:
    import torch

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # --standalone: the rendezvous store binds a port of its own, none another test can take.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(Path(__file__).parent / "ddp_kept_mean.py"), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for case in ("rank1_drops_all", "accumulated"):
        loss, grads = expected(case)
        for saved in ranks:
            assert saved[case]["loss"] == pytest.approx(loss, rel=1e-12)
            for got, want in zip(saved[case]["grads"], grads, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    # No pair kept on any rank: no gradient at all, so the optimizer cannot step.
    assert all(g is None for saved in ranks for g in saved["none_kept"]["grads"])
    assert [saved["none_kept"]["loss"] for saved in ranks] == [0.0, 0.0]
