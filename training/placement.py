"""Where training's processes and weights go, on a GPU box as on a CPU: one GPU per process
outside a launcher, the ranks under `accelerate launch`, whole copies of LoRA weights that
DeepSpeed ZeRO-3 partitions, and float32 LoRA weights on a quantized (QLoRA) base. Used by
offline DPO (training/train.py) and online DPO (training/online.py); checked on a CPU by
tests/training/test_gpu_paths.py and on a GPU by tests/gpu_check.py."""

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
    """`args` (a TrainingArguments) with one GPU for this process. Outside a launcher
    transformers gives a process every visible GPU (`n_gpu`) and wraps the model in
    nn.DataParallel: TRL's DPO refuses that, online DPO would run on it silently (an n_gpu x
    batch, no autocast). wim trains on the first GPU, where it sampled and judged; `accelerate
    launch` (configs/accelerate/ddp.yaml) uses them all, one per process."""
    if args.n_gpu > 1:
        logger.warning("%d GPUs are visible and no launcher started wim: training on the first "
                       "only. To train on all: accelerate launch --config_file "
                       "configs/accelerate/ddp.yaml -m wim train DIR", args.n_gpu)
        args._n_gpu = 1  # what args.n_gpu returns (tests/training/test_gpu_paths.py)
    return args


def keep_lora_float32(model) -> None:
    """On a quantized base (QLoRA) TRL casts the trainable weights to bfloat16 (offline and
    online). With 8 mantissa bits, Adam's step at DPO's learning rates (5e-7 in the paper) is
    below half a unit in the last place of a LoRA weight, so the weight never changes. The
    trainable weights go back to float32 here, before the optimizer exists; bfloat16 autocast
    still computes in bfloat16."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not (getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False)):
        return
    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()


def gathered(params: dict) -> dict:
    """Whole copies on the CPU of the named parameters. Under DeepSpeed ZeRO-3 a parameter
    larger than the persistence threshold is partitioned and its tensor is empty outside a
    forward; gathering is collective, so every rank calls this. Elsewhere: plain copies."""
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
