"""Where training's processes and weights go, offline and online: one GPU per process, launcher
ranks, LoRA weights gathered under ZeRO-3, float32 LoRA on a quantized base. Checked by
tests/training/test_gpu_paths.py (CPU) and tests/gpu_check.py (GPU)."""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def process_state():
    """accelerate's PartialState: this process's rank among those `accelerate launch` started
    (one process otherwise). Without a GPU the processes join over gloo (`cpu=True`)."""
    from accelerate import PartialState

    from wim.models import device_and_dtype

    return PartialState(cpu=device_and_dtype()[0] == "cpu")


def one_gpu_per_process(args):
    """`args` (TrainingArguments) with one GPU: outside a launcher transformers would wrap the
    model in nn.DataParallel over every GPU, which TRL's DPO refuses and online DPO would run
    silently (an n_gpu x batch, no autocast). The first GPU is where wim sampled and judged."""
    if args.n_gpu > 1:
        logger.warning("%d GPUs are visible and no launcher started wim: training on the first "
                       "only. To train on all: accelerate launch --config_file "
                       "configs/accelerate/ddp.yaml -m wim train DIR", args.n_gpu)
        args._n_gpu = 1  # what args.n_gpu returns (tests/training/test_gpu_paths.py)
    return args


def keep_lora_float32(model) -> None:
    """Trainable weights back to float32 on a quantized base, where TRL casts them to bfloat16:
    with 8 mantissa bits, Adam's step at DPO's learning rates (5e-7 in the paper) is below half
    an ulp of a LoRA weight, so it never changes. Call before the optimizer exists."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not (getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False)):
        return
    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()


def gathered(params: dict) -> dict:
    """Whole CPU copies of the named parameters: ZeRO-3 partitions one above its persistence
    threshold (empty outside a forward). Collective: every rank calls this."""
    import contextlib

    import torch
    from transformers.integrations import is_deepspeed_zero3_enabled

    gather = contextlib.nullcontext()
    if is_deepspeed_zero3_enabled():
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None)
    with gather, torch.no_grad():
        return {n: p.detach().to("cpu", copy=True) for n, p in params.items()}


def save_adapter(model, tokenizer, folder: Path, weights: dict) -> None:
    """The trained adapter from `weights` (gathered, see `gathered`), not from the parameters,
    which ZeRO-3 leaves empty: peft would write zero-size tensors."""
    model.save_pretrained(folder, state_dict=weights)
    tokenizer.save_pretrained(folder)
