"""Which attention DPO trains with on a CPU in bfloat16: transformers' eager attention, not SDPA.

PyTorch's CPU flash-attention kernel (what SDPA runs there, torch 2.13) is no faster in bfloat16
than in float32 forward, and its backward is *slower* in bfloat16. Under bfloat16 autocast that
backward was the largest cost of a DPO step after the matrix products. Eager attention (two
batched matrix products in bfloat16 around a float32 softmax) has no such kernel: quickstart
DPO steps are faster with it in bfloat16, while in float32 the two are within noise
(`bench_dtype.py --parts attn`, tests/benchmarks/results/dtype_attention.txt).
So a bfloat16 model on a CPU trains with eager attention, for the duration of the `with`;
sampling and judging, which run outside it, keep SDPA, and so does every model on a GPU or in
float32. Eager attention keeps each layer's `[batch, heads, length, length]` probabilities for
the backward, so sequences longer than `EAGER_MAX_LENGTH` keep SDPA, whose memory grows with
the length, not its square (a bound chosen, not measured: 1.1 GB for SmolLM2-135M at batch 8).
The eager used, `bfloat16_eager_attention`, is transformers' without its float32 round trip of
those probabilities and without its copies of the key/value heads.
"""

from __future__ import annotations

import contextlib
import sys

#: The name `bfloat16_eager_attention` is registered under, for attention and masks.
BFLOAT16_EAGER = "wim_bfloat16_eager"

#: Longest training sequence (DPO's max_length) for which eager attention is used.
EAGER_MAX_LENGTH = 512


@contextlib.contextmanager
def training_attention(model, max_length: int | None):
    """Within the `with`, a bfloat16 CPU model on SDPA uses `BFLOAT16_EAGER` when `max_length`
    (None: unbounded) is at most EAGER_MAX_LENGTH; restored on exit. Yields the one in use."""
    import torch

    from wim.models import attention_implementation

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    own = base.config._attn_implementation
    if own != "sdpa" or base.device.type != "cpu" or base.dtype != torch.bfloat16 \
            or max_length is None or max_length > EAGER_MAX_LENGTH:
        yield own
        return
    register_bfloat16_eager()
    with attention_implementation(base, BFLOAT16_EAGER):
        yield BFLOAT16_EAGER


def bfloat16_eager_attention(module, query, key, value, attention_mask, scaling: float,
                             dropout: float = 0.0, **kwargs):
    """transformers' eager attention, softmax in the inputs' dtype, no key/value head copies
    (docs/design.md); models with softcapping or sink tokens get their own eager."""
    import torch

    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        own = sys.modules[type(module).__module__].eager_attention_forward
        return own(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                   **kwargs)
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    # The `groups` query heads of one key/value head, one after the other: [b, kv, g * L, d].
    grouped = (query * scaling).reshape(batch, kv_heads, groups * length, dim)
    scores = torch.matmul(grouped, key.transpose(2, 3))
    keys = scores.shape[-1]
    if attention_mask is not None:
        mask = attention_mask[..., :keys]
        mask = mask[:, :, None] if mask.shape[1] == 1 else mask.reshape(batch, kv_heads, groups,
                                                                          length, keys)
        scores = (scores.view(batch, kv_heads, groups, length, keys) + mask).view_as(scores)
    probs = torch.nn.functional.dropout(scores.softmax(dim=-1), p=dropout, training=module.training)
    out = torch.matmul(probs, value).view(batch, heads, length, dim)
    return out.transpose(1, 2).contiguous(), probs.view(batch, heads, length, keys)


def register_bfloat16_eager() -> None:
    """Make `BFLOAT16_EAGER` an attention implementation (with eager's additive masks)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(BFLOAT16_EAGER, bfloat16_eager_attention)
    AttentionMaskInterface.register(BFLOAT16_EAGER, eager_mask)
