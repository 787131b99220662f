"""Which attention DPO trains with on a CPU in bfloat16: transformers' eager attention, not SDPA.

PyTorch's CPU flash-attention kernel (what SDPA runs there, torch 2.13) is no faster in bfloat16
than in float32 forward, and its backward is 1.5-2.7x *slower* in bfloat16. Under bfloat16
autocast that backward was the largest cost of a DPO step after the matrix products. Eager
attention (two batched matrix products in bfloat16 around a float32 softmax) has no such kernel:
ten quickstart DPO steps took 21.1 s with it against 26.2 s with SDPA, while in float32 the two
are within noise (`bench_dtype.py --parts attn`, tests/benchmarks/results/dtype_attention.txt).
So a bfloat16 model on a CPU trains with eager attention, for the duration of the `with`;
sampling and judging, which run outside it, keep SDPA, and so does every model on a GPU or in
float32. Eager attention keeps each layer's `[batch, heads, length, length]` probabilities for
the backward, so sequences longer than `EAGER_MAX_LENGTH` keep SDPA, whose memory grows with
the length, not its square (a bound chosen, not measured: 1.1 GB for SmolLM2-135M at batch 8).
"""

from __future__ import annotations

import contextlib

#: Longest training sequence (DPO's max_length) for which eager attention is used.
EAGER_MAX_LENGTH = 512


@contextlib.contextmanager
def training_attention(model, max_length: int | None):
    """Within the `with`, a bfloat16 model on a CPU that uses SDPA uses eager attention when
    training sequences are at most EAGER_MAX_LENGTH tokens (`max_length`; None: unbounded);
    any other model is left as it is. The model's own implementation is restored on exit.
    Yields the implementation training uses."""
    import torch

    from wim.models import attention_implementation

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    own = base.config._attn_implementation
    if own != "sdpa" or base.device.type != "cpu" or base.dtype != torch.bfloat16 \
            or max_length is None or max_length > EAGER_MAX_LENGTH:
        yield own
        return
    with attention_implementation(base, "eager"):
        yield "eager"
