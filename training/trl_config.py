"""The one mapping from the config to TRL's training arguments, offline and online; every `dpo:`
and `dpo.extra` key arrives or is refused by name (docs/design.md, "Training: rounds, online DPO,
devices"). trl and torch are imported inside functions so that importing this stays cheap.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from training.placement import one_gpu_per_process
from wim.config import Config, ConfigError

# dpo.extra keys that another config key sets: the key to set instead.
OFFLINE_OWN_KEYS = {"precompute_ref_log_probs": "dpo.reference_pass (auto, precompute or per_step)"}
ONLINE_OWN_KEYS = {"max_new_tokens": "training.online_max_new_tokens",
                   "temperature": "training.online_temperature",
                   "top_p": "generation.top_p"}

# dpo: keys online DPO has no use for: (the value that says what online does, why). Any other
# value but the default is refused. No checkpoints: online_run restarts from step 0, and
# WimReward's running totals are in no checkpoint, so one could not be resumed from.
ONLINE_UNUSED = {
    "reference_pass": ("per_step", "online DPO computes the reference log-probabilities every "
                       "step, on that step's new samples, so there is nothing to precompute; "
                       "leave it unset or set per_step."),
    "save_steps": (0, "online runs do not checkpoint (training restarts from step 0 when run "
                   "again); leave it unset or set 0."),
}


def dpo_config(cfg: Config, output_dir: Path, progress: bool, precompute_ref: bool):
    """`trl.DPOConfig`: every `dpo:` key (`reference_pass` as `precompute_ref`) and `dpo.extra`."""
    from trl import DPOConfig

    section = _section(cfg)
    section.pop("reference_pass")
    if not cfg.dpo.save_steps:
        section.pop("save_steps")  # DPOConfig refuses save_steps=0
    offline = dict(
        save_strategy="steps" if cfg.dpo.save_steps else "no",
        save_total_limit=2,  # LoRA checkpoints are small; two guard against a torn last one
        precompute_ref_log_probs=precompute_ref,
    )
    return _build(DPOConfig, "a trl.DPOConfig field", "trl/trainer/dpo_config.py",
                  OFFLINE_OWN_KEYS, cfg, output_dir, progress, {**offline, **section})


def online_dpo_config(cfg: Config, output_dir: Path, progress: bool):
    """`OnlineDPOConfig`: the `dpo:` keys it takes, `dpo.extra`, `training.online_*`, top_p."""
    from trl.experimental.online_dpo import OnlineDPOConfig

    section = _section(cfg)
    default = dataclasses.asdict(type(cfg.dpo)())
    for key, (honest, why) in ONLINE_UNUSED.items():
        value = section.pop(key)
        if value not in (default[key], honest):
            raise ConfigError(f"dpo.{key}: {value!r} is not used by online DPO: {why}")
    section["beta"] = [cfg.dpo.beta]  # a list in OnlineDPOConfig (one beta per epoch)
    t = cfg.training
    online = dict(
        max_new_tokens=t.online_max_new_tokens, temperature=t.online_temperature,
        top_p=cfg.generation.top_p, save_strategy="no", loss_type="sigmoid",
        # TRL samples without a KV cache when checkpointing is on, several times slower; it
        # samples under no_grad, where transformers keeps the cache with checkpointing on.
        generation_kwargs={"use_cache": True},
    )
    return _build(OnlineDPOConfig,
                  "a field of trl's OnlineDPOConfig (training.mode: online)",
                  "trl/experimental/online_dpo/online_dpo_config.py", ONLINE_OWN_KEYS,
                  cfg, output_dir, progress, {**online, **section})


def _section(cfg: Config) -> dict[str, Any]:
    """The `dpo:` section's keys and values, without `extra`."""
    return {f.name: getattr(cfg.dpo, f.name) for f in dataclasses.fields(cfg.dpo)
            if f.name != "extra"}


def _build(target, field_of: str, source: str, own_keys: dict[str, str], cfg: Config,
           output_dir: Path, progress: bool, settings: dict[str, Any]):
    """`target(...)` from the settings shared by both modes, then `settings` (the mode's and
    the section's), then `dpo.extra`, whose keys are checked by name against `target` first."""
    known = {f.name for f in dataclasses.fields(target)}
    section_keys = {f.name for f in dataclasses.fields(cfg.dpo)} - {"extra"}
    for key in cfg.dpo.extra:
        if key in own_keys:
            raise ConfigError(f"dpo.extra: '{key}' has its own key; set {own_keys[key]} "
                              "instead.")
        if key not in known:
            raise ConfigError(f"dpo.extra: '{key}' is not {field_of}; check the spelling "
                              f"against {source} of the installed trl.")
        if key in section_keys:
            raise ConfigError(f"dpo.extra: '{key}' has its own key; set dpo.{key} instead.")
    return one_gpu_per_process(target(**{**_shared(cfg, output_dir, progress), **settings,
                                         **cfg.dpo.extra}))


def _shared(cfg: Config, output_dir: Path, progress: bool) -> dict[str, Any]:
    """The arguments both modes take from outside the `dpo:` section."""
    import torch

    from wim.models import device_and_dtype

    if cfg.wandb.enabled:
        os.environ.setdefault("WANDB_PROJECT", cfg.wandb.project)  # read by the wandb callback
    device, dtype = device_and_dtype(cfg.policy.dtype)
    return dict(
        output_dir=str(output_dir),
        # the GPU whenever there is one (the Trainer refuses bf16 on a CPU unless told it is one)
        use_cpu=device == "cpu",
        bf16=dtype == torch.bfloat16,  # mixed precision: bfloat16 autocast, float32 LoRA weights
        # TRL turns checkpointing on by default; it is a config switch here (memory vs time).
        # (transformers 5 renamed gradient_checkpointing to activation_checkpointing.)
        activation_checkpointing=cfg.training.gradient_checkpointing,
        seed=cfg.seed,
        report_to="wandb" if cfg.wandb.enabled else "none",
        disable_tqdm=not progress,
    )
