"""The train stage (`wim train`, and `wim run` after pairs): offline DPO, a LoRA adapter trained
with `trl.DPOTrainer` on a run's `pairs.jsonl` into DIR/train/. torch, trl, peft and datasets
are imported inside functions so that `import training.train` stays cheap.

What a caller relies on:
- the dtype is decided where training runs (`RunDir.training_dtype`), not where the run
  directory was made; a policy already in memory (`Resources`) is trained in place, so the next
  round samples and judges with the new adapter;
- a checkpoint is resumed only by the same training (`resume_key`: the stage's fingerprint of
  the config and pairs); any other is deleted, never mixed in;
- `dpo:` goes into `trl.DPOConfig` through training/trl_config.py (shared with online DPO); no
  pairs is an InputError, an unknown `dpo.extra` field a ConfigError;
- with `http.adapter_serving: vllm` the trained adapter is registered on the policy's server
  (wim/backends/adapter_serving.py) before the stats are written.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from data_gen.pipeline import Resources
from data_gen.stages import Shard
from training.cpu_attention import training_attention
from training.placement import (
    gathered,
    keep_lora_float32,
    process_state,
    save_adapter,
)
from training.trl_config import dpo_config
from wim.backends.adapter_serving import serve_adapter
from wim.config import Config
from wim.errors import InputError
from wim.models import load_causal_lm
from wim.records import RecordsError
from wim.rundir import ADAPTER_NAME, LOG_HISTORY, TRAIN_METRICS, RunDir

logger = logging.getLogger(__name__)

#: The only columns TRL gets; the audit columns (scores, critiques, ids) stay in pairs.jsonl.
TRL_COLUMNS = ["prompt", "chosen", "rejected"]


def run_stage(cfg: Config, run: RunDir, res: Resources, shard: Shard | None, progress: bool,
              fingerprint: str) -> dict[str, Any]:
    return train_run(cfg, run, progress, resume_key=fingerprint, resources=res)


def train_run(cfg: Config, run: RunDir, progress: bool = True,
              resume_key: str | None = None, resources: Resources | None = None
              ) -> dict[str, Any]:
    """DPO on the run's pairs, on the shared model when `resources` holds one (trained in
    place: the next round samples and judges with the new adapter)."""
    start = time.perf_counter()
    # The dtype is decided here, where training runs (a directory made on a CPU trains in
    # bfloat16 on a GPU); a policy already in memory in the run's dtype trains under autocast.
    cfg = replace(cfg, policy=replace(cfg.policy, dtype=run.training_dtype(cfg)))
    lm = resources.trainable_lm(cfg.policy.dtype) if resources is not None else None
    metrics, model = train_dpo_model(cfg, run.pairs, run.train_folder, progress=progress,
                                     resume_key=resume_key, lm=lm)
    if lm is not None:
        resources.set_trained((model, lm[1]), str(run.adapter))
    if (cfg.policy.backend == "http" and cfg.http.adapter_serving == "vllm"
            and process_state().is_main_process):
        # The next round (and `wim eval`) samples by this name on the policy's server.
        metrics["train/served_adapter"] = serve_adapter(cfg.http, run.adapter)
    metrics["time/train"] = time.perf_counter() - start
    if process_state().is_main_process:
        run.write_stats("train", metrics)
    return metrics


def train_dpo_model(
    cfg: Config,
    pairs_path: str | Path,
    out_dir: str | Path,
    *,
    progress: bool = True,
    resume_key: str | None = None,
    lm: tuple[Any, Any] | None = None,
) -> tuple[dict[str, float | int], Any]:
    """Train a LoRA adapter with DPO on the pairs and save it to `out_dir/adapter`, with
    metrics.json, log_history.json and ranks/<rank>.json. Returns (metrics, trained model).

    `lm`: (model, tokenizer) already in memory, trained in place (docs/design.md, "Training:
    rounds, online DPO, devices"); without it the policy is loaded in `policy.dtype`.
    `train/lora_delta_norm` is the L2 change of the LoRA weights (> 0 once anything was
    learned); a resumed training measures it from the start weights kept in
    `train/trainer/lora_init.pt`. Checkpoints (`out_dir/trainer/checkpoint-*`) are resumed only
    by a training with the same `resume_key` (the caller's hash of the config and pairs), else
    deleted.
    Raises InputError without pairs, ConfigError when `cfg.dpo.extra` names a non-DPOConfig field.
    """
    from training.dpo_trainer import WimDPOTrainer

    pairs_path, out_dir = Path(pairs_path), Path(out_dir)
    n_pairs = _count_pairs(pairs_path)  # before the model load, so an empty run fails fast
    state = process_state()
    args = _dpo_args(cfg, out_dir / "trainer", progress, n_pairs, state.num_processes)
    with state.main_process_first():  # rank 0 cleans stale checkpoints before others look
        checkpoint = _resumable_checkpoint(out_dir / "trainer", resume_key, state.is_main_process)
    dataset = _load_pairs(pairs_path)

    if lm is None:
        lm = load_causal_lm(cfg.policy.model,
                            load_in_4bit=cfg.training.load_in_4bit, dtype=cfg.policy.dtype)
    model, tokenizer = lm
    model, peft_config = _adapter_to_train(cfg, model)
    _reset_peak_memory()
    with training_attention(model, args.max_length) as attention:
        trainer = WimDPOTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
        )
        keep_lora_float32(trainer.model)
        lora = {n: p for n, p in trainer.model.named_parameters()
                if "lora_" in n and p.requires_grad and ".ref." not in n}
        start_weights = gathered(lora)  # every rank, outside main_process_first: collective
        with state.main_process_first():
            initial = _initial_lora(start_weights, out_dir / "trainer" / "lora_init.pt",
                                    checkpoint is not None, state.is_main_process)

        start = time.perf_counter()
        if checkpoint:
            logger.info("DPO: resuming from %s", checkpoint)
        with lora_inputs_uncast(trainer.model, args):
            trainer.train(resume_from_checkpoint=checkpoint)
        seconds = time.perf_counter() - start

    final = gathered(lora)  # ZeRO-3 leaves partitioned LoRA tensors empty outside a forward
    delta = sum(float((final[n] - initial[n]).pow(2).sum()) for n in final)  # detached copies
    trained = trainer.model
    if "ref" in getattr(trained, "peft_config", {}):
        trained.delete_adapter("ref")  # TRL's frozen reference copy of a continued adapter
    trained.eval()
    history = trainer.state.log_history
    metrics = {**_summarize(history, trainer.state.global_step, n_pairs, seconds),
               "train/lora_delta_norm": math.sqrt(delta), **_precision(args, trained, lora),
               "train/attention": attention,
               "train/resumed_from_step": int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0,
               **peak_memory("train")}
    _write_rank(out_dir, state, trainer.state.global_step, final)
    if state.is_main_process:
        save_adapter(trained, tokenizer, out_dir / ADAPTER_NAME, final)
        (out_dir / LOG_HISTORY).write_text(json.dumps(history, indent=2))
        (out_dir / TRAIN_METRICS).write_text(json.dumps(metrics, indent=2))
    logger.info("DPO: %d steps on %d pairs in %.1f s", metrics["train/steps"], n_pairs, seconds)
    return metrics, trained


def lora_inputs_uncast(model, args):
    """Under bfloat16 autocast, peft's LoRA layers take their input uncast: peft's cast to the
    float32 weights, undone by autocast, copies every LoRA input and changes no result."""
    from peft.helpers import disable_input_dtype_casting

    return disable_input_dtype_casting(model) if args.bf16 else contextlib.nullcontext()


def _precision(args, model, lora: dict) -> dict[str, str]:
    """What training computed in, and the dtype of the weights it trained (float32 even on a
    bfloat16 base: the optimizer's updates are too small for bfloat16's 8 mantissa bits)."""
    base = next(p.dtype for n, p in model.named_parameters() if "lora_" not in n)
    return {"train/compute_dtype": "bfloat16" if args.bf16 else str(base).removeprefix("torch."),
            "train/base_dtype": str(base).removeprefix("torch."),
            "train/lora_dtype": sorted({str(p.dtype).removeprefix("torch.")
                                        for p in lora.values()})[0] if lora else None}


def lora_config(cfg: Config):
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                      target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM")


def _adapter_to_train(cfg: Config, model):
    """(model, peft_config for TRL): continue a PeftModel's adapter, or a fresh one on the base."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        if cfg.training.adapter == "continue":
            return model, None
        model = model.unload()  # the base weights, the old adapter's layers removed
    return model, lora_config(cfg)


def _reset_peak_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory(prefix: str) -> dict[str, float]:
    """`<prefix>/peak_rss_mb`: the process's peak resident memory so far (ru_maxrss), and
    `<prefix>/peak_gpu_mb`: the most GPU memory torch held since the last reset (GPU only)."""
    import resource
    import sys

    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out = {f"{prefix}/peak_rss_mb": round(rss / (1 << 20 if sys.platform == "darwin" else 1024), 1)}
    if torch.cuda.is_available():
        out[f"{prefix}/peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / (1 << 20), 1)
    return out


def _write_rank(out_dir: Path, state, steps: int, lora: dict) -> None:
    """`ranks/<rank>.json`: this process's steps and a checksum of its LoRA weights (equal on
    every rank when data-parallel training kept them in sync)."""
    checksum = sum(float(p.detach().double().abs().sum()) for p in lora.values())
    folder = out_dir / "ranks"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{state.process_index}.json").write_text(json.dumps(
        {"rank": state.process_index, "world_size": state.num_processes, "steps": int(steps),
         "lora_checksum": checksum}))


def _resumable_checkpoint(trainer_dir: Path, resume_key: str | None, main: bool = True
                          ) -> str | None:
    """The last checkpoint of this same training, or None (then any stale one is removed;
    only by the main process, the others run after it)."""
    import shutil

    from transformers.trainer_utils import get_last_checkpoint

    key_file = trainer_dir / "resume_key.txt"
    if resume_key and trainer_dir.is_dir() and key_file.is_file():
        if key_file.read_text().strip() == resume_key:
            return get_last_checkpoint(str(trainer_dir))
    if not main:
        return None
    if trainer_dir.exists():
        shutil.rmtree(trainer_dir)  # checkpoints of another config or pairs: never resumed
    trainer_dir.mkdir(parents=True)
    if resume_key:
        key_file.write_text(resume_key + "\n")
    return None


def _initial_lora(start: dict, path: Path, resuming: bool, main: bool = True) -> dict:
    """The LoRA weights before any step (`start`: gathered copies on the CPU), kept on disk so
    that a resumed training measures its weight change from the same start."""
    import torch

    if resuming and path.is_file():
        return torch.load(path, map_location="cpu")  # not onto the GPU of the rank that saved
    if main:
        torch.save(start, path)
    return start


def _count_pairs(pairs_path: Path) -> int:
    if not pairs_path.is_file():
        raise InputError(f"pairs file '{pairs_path}' does not exist; run `wim pairs` first.")
    with pairs_path.open() as f:
        n = sum(1 for line in f if line.strip())
    if n == 0:
        raise InputError(
            f"no preference pairs to train on: every prompt tied or failed to parse ({pairs_path} "
            "is empty). Sample more responses per prompt (generation.k), use more prompts, set "
            "pairs.tie_policy to 'first' or 'random', or use a stronger judge."
        )
    return n


def precompute_reference(cfg: Config, n_pairs: int, processes: int = 1) -> bool:
    """`dpo.reference_pass`: precompute the reference (`auto`: when training sees a pair more
    than once, so that one pass replaces several; docs/design.md, "Training")."""
    if cfg.dpo.reference_pass != "auto":
        return cfg.dpo.reference_pass == "precompute"
    seen = (cfg.dpo.max_steps * cfg.dpo.per_device_train_batch_size
            * cfg.dpo.gradient_accumulation_steps * processes)
    return seen > n_pairs


def _dpo_args(cfg: Config, output_dir: Path, progress: bool, n_pairs: int, processes: int = 1):
    """`trl.DPOConfig` for this training (training/trl_config.py, shared with online DPO)."""
    return dpo_config(cfg, output_dir, progress, precompute_reference(cfg, n_pairs, processes))


def _load_pairs(pairs_path: Path):
    from datasets import load_dataset

    dataset = load_dataset("json", data_files=str(pairs_path), split="train")
    missing = [c for c in TRL_COLUMNS if c not in dataset.column_names]
    if missing:
        raise RecordsError(
            f"{pairs_path}: pairs lack the column(s) {missing}; expected {TRL_COLUMNS}."
        )
    return dataset.select_columns(TRL_COLUMNS)


def _summarize(history: list[dict], steps: int, n_pairs: int, seconds: float) -> dict:
    """Metrics from TRL's log history (per-step entries carry `loss`)."""
    logged = [h for h in history if "loss" in h]
    metrics: dict[str, float | int] = {
        "train/steps": int(steps),
        "train/loss_first": float(logged[0]["loss"]) if logged else math.nan,
        "train/loss_last": float(logged[-1]["loss"]) if logged else math.nan,
        "train/pairs": n_pairs,
        "train/seconds": round(seconds, 3),
    }
    for key, name in (("rewards/accuracies", "reward_accuracy"),
                      ("rewards/margins", "reward_margin")):
        values = [h[key] for h in history if key in h]
        if values:
            metrics[f"train/{name}_last"] = float(values[-1])
            metrics[f"train/{name}_mean"] = float(sum(values) / len(values))
    return metrics
