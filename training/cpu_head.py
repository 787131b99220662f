"""DPO's log-probabilities without a GPU: score only the completion tokens, in cache-sized tiles.

TRL's DPOTrainer puts a fused LM head on the model (`trl.trainer.utils.add_fused_lm_head`): the
per-token log-probabilities come from `trl.kernels.ChunkedLogProbFunction`, which projects
through the LM head tile by tile and never holds the whole `[tokens, vocabulary]` logits. On a
GPU with Triton it scores only the positions whose label counts (the completion). Elsewhere it
scores every position, prompt and padding included (a fixed tile shape keeps compilers such as
Neuron's from recompiling), in tiles of 4096 tokens x 32768 vocabulary columns: about 0.5 GB of
float32 per tile, passed over a dozen times by the elementwise folds. On a CPU that memory
traffic, not the matrix products, was most of a DPO step, in float32 and in bfloat16 alike.

`score_completions_only` scores the completion positions only, through
training/cpu_logprobs.py's cache-sized tiles. The result has the same fields, shapes and values
(to float rounding) as TRL's; any call it does not handle (other models' logit scaling or
softcapping, pre-shifted labels, MoE router losses) goes to TRL's forward unchanged.
"""

from __future__ import annotations

import functools
import types
from typing import Any

#: Tokens per kernel call: measured on a 2-core CPU (tests/benchmarks/results/cpu_head.txt);
#: it also bounds the kernel's bfloat16 gradient buffer (TOKEN_TILE x vocabulary).
TOKEN_TILE = 512

#: Config fields under which models scale or cap their logits; TRL's forward handles those.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier",
                     "lm_head_multiplier", "logits_scaling")


def use_compact_head(trainer) -> bool:
    """Without Triton, make a DPOTrainer's policy (and own reference model) score completion
    tokens only, after TRL put its head on; idempotent. Returns whether the policy does."""
    if trainer.accelerator.device.type in ("cuda", "xpu"):  # TRL's own head is compact there
        return False
    # The fields TRL 1.16's DPOTrainer asks its head for (its __init__, add_fused_lm_head).
    outputs = ("log_probs", "entropy", "mean_logits", "is_top1")
    if trainer.use_weighting:
        outputs += ("log_sum_sq_probs",)
    model = trainer.model
    if hasattr(model, "get_base_model"):  # peft: TRL patched the model under the adapter
        model = model.get_base_model()
    done = score_completions_only(model, outputs)
    if trainer.ref_model is not None:
        done = score_completions_only(trainer.ref_model, ("log_probs",)) and done
    return done


def score_completions_only(model, outputs: tuple[str, ...]) -> bool:
    """Wrap a TRL-patched `model.forward` so that fused calls score the labelled positions only,
    with the fields in `outputs`. False, changing nothing, when logits are scaled or capped."""
    if getattr(model.forward, "scores_completions_only", False):
        return True
    text_config = model.config.get_text_config()
    if any(getattr(text_config, name, None) is not None for name in _LOGIT_TRANSFORMS):
        return False
    trl_forward = model.forward

    @functools.wraps(type(model).forward)  # `generate` checks its kwargs against the signature
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None,
                num_items_in_batch=None, **kwargs):
        if not fused_lm_head or shift_labels is not None or kwargs.get("output_router_logits") \
                or getattr(text_config, "output_router_logits", False):
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels,
                               shift_labels=shift_labels, num_items_in_batch=num_items_in_batch,
                               **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state[:, :-1]
        labels = labels[:, 1:]
        mask = labels != -100
        head = self.get_output_embeddings()
        per_token = _log_probs(hidden[mask], head.weight, head.bias, labels[mask], outputs)
        # `masked_scatter` keeps the graph connected when no label counts (as TRL does).
        log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1 = (
            None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x)
            for x in per_token)
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None
                                   else num_items_in_batch)
        from trl.trainer.utils import FusedCausalLMOutput

        return FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy,
                                   log_sum_sq_probs=log_sum_sq_probs, mean_logits=mean_logits,
                                   is_top1=is_top1, label_mask=mask, aux_loss=None)

    forward.scores_completions_only = True  # so that a second call does not wrap it again
    model.forward = types.MethodType(forward, model)
    return True


def _log_probs(hidden, weight, bias, targets, outputs: tuple[str, ...]) -> list[Any]:
    """The kernel over `TOKEN_TILE` rows at a time, its five per-token fields concatenated."""
    import torch

    from training.cpu_logprobs import completion_log_probs

    # At least one call, so that a batch without a completion token still yields a graph.
    tiles = [completion_log_probs(hidden[i:i + TOKEN_TILE], weight, bias,
                                  targets[i:i + TOKEN_TILE], outputs)
             for i in range(0, max(len(hidden), 1), TOKEN_TILE)]
    return [None if field[0] is None else torch.cat(field) for field in zip(*tiles, strict=True)]
