"""Training on the pairs: the `lora:`, `dpo:`, `training:` and `wandb:` sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class LoraConfig:
    """The LoRA adapter DPO trains (peft.LoraConfig)."""

    r: int = 8
    """Rank of the low-rank update."""
    alpha: int = 16
    """Scaling numerator: the update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input during training."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Names of the linear layers that get an adapter."""


@dataclass
class DPOSection:
    """Passed to `trl.DPOConfig` (plus `extra` for any other DPOConfig field)."""

    learning_rate: float = 5e-5
    """Peak learning rate of the adapter weights."""
    beta: float = 0.1
    """DPO beta: how far the policy may move from the reference (larger = closer)."""
    max_steps: int = 8
    """Optimizer steps to train."""
    per_device_train_batch_size: int = 4
    """Pairs per step (before gradient accumulation)."""
    gradient_accumulation_steps: int = 1
    """Steps whose gradients are summed before one optimizer update."""
    max_length: int = 256
    """Most tokens of prompt plus response; longer pairs are truncated."""
    logging_steps: int = 1
    """Log the loss every this many steps."""
    save_steps: int = 25
    """Save a checkpoint every this many steps (and at the end), so that a killed training
    resumes from its last checkpoint when the same command runs again; 0: no checkpoints."""
    reference_pass: Literal["auto", "precompute", "per_step"] = "auto"
    """The reference log-probabilities (base, adapter off): `precompute` before training, or
    `per_step`; `auto` precomputes when training sees the pairs more than once (docs/design.md,
    "Training")."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Any other trl.DPOConfig field, by its name (checked against the installed TRL)."""


@dataclass
class TrainingConfig:
    """How training feeds back into sampling and judging (rounds), and where it runs."""

    rounds: int = 1
    """Iterations of sample -> judge -> score -> pairs -> train, each sampling with the previous
    round's adapter (docs/design.md, "Training"). 1: one pass; more: DIR/rounds/<r>/."""
    adapter: Literal["continue", "fresh"] = "continue"
    """Each round after the first: `continue` training the previous round's adapter (the
    reference: its state at the round's start) or train a `fresh` one on the base."""
    mode: Literal["offline", "online"] = "offline"
    """`offline`: DPO on the pairs of each round (trl.DPOTrainer). `online`: OnlineDPOTrainer
    samples 2 completions per prompt each step, the judge's WIM score their reward."""
    online_tie_policy: Literal["drop", "first"] = "drop"
    """Online mode, two completions that tie (pairs.tie_tolerance): `drop` the pair from the
    loss, or take the `first` as chosen (TRL's own rule, and the authors' code). Counted."""
    online_max_new_tokens: int = 64
    """Online mode: most tokens per sampled completion (the paper: 256)."""
    online_temperature: float = 0.9
    """Online mode: sampling temperature of the two completions (the paper: 0.9)."""
    load_in_4bit: bool = False
    """QLoRA: load the policy's base weights in 4 bit (bitsandbytes, CUDA only)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about 30% more time."""


@dataclass
class WandbConfig:
    enabled: bool = False
    """Log training and the report's metrics to Weights & Biases."""
    project: str = "wim"
    """The wandb project name."""
