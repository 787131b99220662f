"""Attention for one new token at a time on a CPU: two matrix products instead of SDPA's kernel.

PyTorch's CPU flash-attention kernel (what SDPA runs there, torch 2.13) is slow for one query
row, most of all in bfloat16 (hardly faster than in float32); two matrix products around a
float32 softmax are faster for SmolLM2-135M's heads at 8-32 rows x 120-1100 cached positions in
both dtypes (tests/benchmarks/bench_decode_attention.py, results/decode_attention.txt). The
arithmetic is transformers' eager attention's (scores rounded to the model's dtype, softmax in
float32) without its copies of the key/value heads; any other call (prompt prefill) stays
SDPA, the faster one there, and training never runs under it (`decoding_attention` switches it
on for a `with` only). In bfloat16 the rounded scores change some greedy outputs against SDPA's
(docs/benchmarks.md); in float32 the two agree to float rounding
(tests/wim/test_decode_attention.py).
"""

from __future__ import annotations

import contextlib

#: The name it is registered under in transformers' AttentionInterface.
NAME = "wim_cpu_decode"

# Arguments of transformers' attention functions this one does not implement: with any of
# them set, the call goes to SDPA.
_SDPA_ONLY = ("softcap", "position_bias", "s_aux", "sinks")


def decode_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, is_causal: bool | None = None,
                             **kwargs):
    """transformers' attention-function signature: `query` [batch, heads, q_len, head_dim],
    `key`/`value` [batch, kv_heads, kv_len, head_dim], `attention_mask` a boolean (True:
    attend) or additive mask broadcastable to [batch, 1, q_len, kv_len], or None. Returns
    ([batch, q_len, heads, head_dim], None)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or dropout or key.shape[-1] != value.shape[-1] \
            or any(kwargs.get(name) is not None for name in _SDPA_ONLY):
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, is_causal=is_causal,
                                      **kwargs)
    batch, heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    # The query heads that share a key/value head become rows of one product with it.
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float()  # [batch, kv_heads, group, kv]
    scores.mul_(head_dim ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, : key.shape[2]]  # [batch, 1, 1, kv]: every head alike
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # [batch, kv_heads, group, head_dim]
    return out.reshape(batch, 1, heads, head_dim), None


@contextlib.contextmanager
def decoding_attention(model):
    """Within the `with`, a model on a CPU that uses SDPA uses `decode_attention_forward`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from wim.models import attention_implementation

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "_attn_implementation", None) != "sdpa" \
            or base.device.type != "cpu":
        yield
        return
    AttentionInterface.register(NAME, decode_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the same masks SDPA gets
    with attention_implementation(base, NAME):
        yield
