"""The online DPO trainer: TRL 1.16's OnlineDPOTrainer with our pair rule and a loss that is the
mean over the pairs kept in a step.

TRL picks chosen and rejected by an exact comparison of the rewards and averages the loss over
every pair; it cannot leave a pair out. `WimOnlineDPOTrainer` overrides `training_step` only. It
reuses TRL's `_generate`, `_forward` and `_calculate_rewards_from_functions`, and takes the
verdict on each pair (which side is chosen, whether it trains) from its reward function's
`take_choice()`. No attribute of TRL's modules is touched.

The loss of one optimizer step is the mean of the per-pair sigmoid DPO loss over the pairs kept
in that step, over every micro-batch of gradient accumulation and every rank (`KeptPairMean`).
A step that keeps no pair anywhere leaves the weights and the optimizer state as they were:
every gradient is set to None, and torch's optimizers skip a parameter without a gradient
(AdamW would otherwise move the weights with its stored momentum). Such a step still counts:
global_step, max_steps and the learning-rate schedule advance as for any other step (the
schedule is in steps, not in updates), and it logs loss 0 and grad_norm 0.

The override is a copy of TRL 1.16's `training_step` minus what we do not use (vLLM, images,
the IPO loss, the missing-EOS penalty, fp16), each refused in `__init__`; hence the pin
`trl<1.17` and the version check in `__init__` (`TRL_CHECKED`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import trl
from packaging.version import Version
from trl.data_utils import is_conversational
from trl.experimental.online_dpo import OnlineDPOTrainer
from trl.experimental.utils import empty_cache

# The versions whose `training_step` this module's override was checked against.
TRL_CHECKED = (Version("1.16"), Version("1.17"))


@dataclass(frozen=True)
class PairChoice:
    """The verdict on the B pairs of one micro-batch; pair i is completion i against i + B."""

    first_chosen: list[bool]
    """Completion i is chosen (else completion i + B)."""
    keep: list[bool]
    """The pair enters the loss (False: a dropped tie, a failed judgement)."""


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (in place); the tensor itself in a single process."""
    if world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def sigmoid_losses(beta: float, chosen: torch.Tensor, rejected: torch.Tensor,
                   chosen_ref: torch.Tensor, rejected_ref: torch.Tensor) -> torch.Tensor:
    """Per-pair DPO loss -log sigmoid(beta * ((c - r) - (c_ref - r_ref))) on summed logprobs."""
    return -F.logsigmoid(beta * ((chosen - rejected) - (chosen_ref - rejected_ref)))


class KeptPairMean:
    """The mean loss over the kept pairs of one optimizer step, across micro-batches and ranks
    (docs/design.md, "Training: rounds, online DPO, devices")."""

    def __init__(self) -> None:
        self.count = 0  # kept pairs of this step on this rank
        self.loss_sum = 0.0  # their summed loss (detached), for the log

    def micro_batch_loss(self, losses: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """What this micro-batch backpropagates. Dropped pairs stay in the graph with weight 0,
        so every rank's backward reaches every parameter (DDP waits for all of them)."""
        if keep.dtype != torch.bool or keep.shape != losses.shape:
            raise RuntimeError(f"keep mask must be bool of shape {tuple(losses.shape)}, got "
                               f"{keep.dtype} {tuple(keep.shape)}")
        kept = torch.where(keep, losses, torch.zeros_like(losses)).sum()
        self.count += int(keep.sum())
        self.loss_sum += float(kept.detach())
        return kept * world_size()

    def finish(self, parameters, backward_scale: float, device: torch.device) -> float:
        """After the step's last backward: gradients of sum / backward_scale (accelerate divides
        by the accumulation steps) become the mean over kept pairs. Returns the step's loss, the
        same on every rank (0.0 when no pair was kept)."""
        totals = all_reduce_sum(torch.tensor([float(self.count), self.loss_sum],
                                             dtype=torch.float64, device=device))
        count, loss_sum = int(totals[0].item()), float(totals[1].item())
        self.count, self.loss_sum = 0, 0.0
        for p in parameters:
            if p.grad is None:
                continue
            if count == 0:
                p.grad = None  # the optimizer skips it: no update, no momentum step
            else:
                p.grad.mul_(backward_scale / count)
        return loss_sum / count if count else 0.0


class WimOnlineDPOTrainer(OnlineDPOTrainer):
    """OnlineDPOTrainer whose pairs are chosen, kept or dropped by its reward function: one
    callable whose `take_choice() -> PairChoice | None` returns its last verdict and forgets it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not TRL_CHECKED[0] <= Version(trl.__version__) < TRL_CHECKED[1]:
            raise RuntimeError(
                f"WimOnlineDPOTrainer overrides TRL 1.16's OnlineDPOTrainer.training_step; "
                f"trl {trl.__version__} is installed: check the override against it")
        super().__init__(*args, **kwargs)
        a = self.args
        unsupported = {"use_vllm": a.use_vllm, "fp16": a.fp16,
                       "loss_type != sigmoid": a.loss_type != "sigmoid",
                       "missing_eos_penalty": a.missing_eos_penalty is not None}
        if any(unsupported.values()):
            raise ValueError(f"not supported here: {[k for k, v in unsupported.items() if v]}")
        if len(self.reward_funcs) != 1 or not hasattr(self.reward_funcs[0], "take_choice"):
            raise TypeError("WimOnlineDPOTrainer needs one reward function with take_choice()")
        self.kept_mean = KeptPairMean()

    def _take_choice(self, batch_size: int, device: torch.device):
        choice = self.reward_funcs[0].take_choice()
        if choice is None:
            raise RuntimeError("the reward function left no pair choice for this batch")
        if len(choice.keep) != batch_size or len(choice.first_chosen) != batch_size:
            raise RuntimeError(f"pair choice for {len(choice.keep)} / {len(choice.first_chosen)}"
                               f" pairs, the batch has {batch_size}")
        return (torch.tensor(choice.first_chosen, dtype=torch.bool, device=device),
                torch.tensor(choice.keep, dtype=torch.bool, device=device))

    def training_step(self, model, inputs: dict[str, Any], num_items_in_batch=None) -> torch.Tensor:
        model.train()
        prompts = inputs["prompt"]
        if "image" in inputs:
            raise ValueError("WimOnlineDPOTrainer takes text prompts only")
        b = len(prompts)
        prompt_ids, prompt_mask, completion_ids, completion_mask, _ = self._generate(model, prompts)
        eos = torch.tensor(self.eos_token_ids, device=completion_ids.device)
        contain_eos = torch.any(torch.isin(completion_ids, eos), dim=-1)
        batch = (prompt_ids, prompt_mask, completion_ids, completion_mask)
        logprobs = self._forward(model, *batch)
        with torch.no_grad():
            if self.ref_model is not None:
                ref_logprobs = self._forward(self.ref_model, *batch)
            else:  # peft: the reference is the same weights with the adapter off
                with self.model.disable_adapter():
                    ref_logprobs = self._forward(self.model, *batch)
        device = logprobs.device
        completions = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        if is_conversational({"prompt": prompts[0]}):
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        extra = {k: (v * 2 if isinstance(v, (list, tuple)) else v)
                 for k, v in inputs.items() if k != "prompt"}
        rewards = self._calculate_rewards_from_functions(
            prompts=2 * prompts, completions=completions,
            completion_ids_list=[ids.tolist() for ids in completion_ids], **extra)
        first, keep = self._take_choice(b, device)

        pairs = torch.arange(b, device=device)
        chosen, rejected = pairs + (~first) * b, pairs + first * b
        tokens = completion_mask.bool()
        c, r = [(logprobs[i] * tokens[i]).sum(1) for i in (chosen, rejected)]
        c_ref, r_ref = [(ref_logprobs[i] * tokens[i]).sum(1) for i in (chosen, rejected)]
        losses = sigmoid_losses(self.beta, c, r, c_ref, r_ref)
        self.accelerator.backward(self.kept_mean.micro_batch_loss(losses, keep))
        with torch.no_grad():
            self._log(logprobs, ref_logprobs, contain_eos, rewards, keep, chosen, rejected,
                      (c, r, c_ref, r_ref))
        if self.args.torch_empty_cache_steps is not None and \
                self.state.global_step % self.args.torch_empty_cache_steps == 0:
            empty_cache()
        if not self.accelerator.sync_gradients:
            return torch.zeros((), device=self.args.device)  # the step's loss comes at its end
        loss = self.kept_mean.finish(model.parameters(),
                                     self.accelerator.gradient_accumulation_steps, device)
        return torch.tensor(loss, device=self.args.device)

    def _log(self, logprobs, ref_logprobs, contain_eos, rewards, keep, chosen, rejected,
             sums) -> None:
        """TRL's statistics, the pair ones over kept pairs only (across ranks; nan when none
        was kept); those of the samples (KL, entropy, EOS) over every completion."""
        c, r, c_ref, r_ref = sums
        beta = self.beta
        kl = (logprobs - ref_logprobs).sum(1)
        non_score = -beta * kl
        chosen_rewards, rejected_rewards = beta * (c - c_ref), beta * (r - r_ref)
        margins = chosen_rewards - rejected_rewards
        per_pair = {
            "objective/scores": (rewards[chosen] + rewards[rejected]) / 2,
            "objective/scores_margin": rewards[chosen] - rewards[rejected],
            "objective/rlhf_reward": ((rewards + non_score)[chosen]
                                      + (rewards + non_score)[rejected]) / 2,
            "logps/chosen": c, "logps/rejected": r,
            "rewards/chosen": chosen_rewards, "rewards/rejected": rejected_rewards,
            "rewards/margins": margins, "rewards/accuracies": (margins > 0).float()}
        values = torch.stack([v.float() for v in per_pair.values()])
        sums_and_count = torch.cat([torch.where(keep, values, 0.0).sum(1),
                                    keep.float().sum().reshape(1)])
        totals = all_reduce_sum(sums_and_count.double()).tolist()
        for key, total in zip(per_pair, totals[:-1], strict=True):
            self.stats[key].append(total / totals[-1] if totals[-1] else math.nan)
        gather = self.accelerator.gather_for_metrics
        self.stats["objective/kl"].append(gather(kl.mean()).mean().item())
        self.stats["objective/non_score_reward"].append(gather(non_score.mean()).mean().item())
        self.stats["objective/entropy"].append(gather(-logprobs.sum(1).mean()).mean().item())
        self.stats["val/contain_eos_token"].append(contain_eos.float().mean().item())
        self.stats["beta"].append(beta)
