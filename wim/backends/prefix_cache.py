"""Shared-prefix KV reuse for the transformers backend.

Every judge prompt starts with the same tokens (the chat template and the judge's instructions,
about 200 tokens). The prefix is run once per `generate` call and its key/value cache written
into every batch's `StaticCache`, from which transformers' `generate` decodes the batch:

    [prefix: P tokens][pad ... pad][suffix tokens of this row]
    mask: 1 ... 1      0 ... 0      1 ... 1

The position ids follow from the mask (its cumulative sum, as in `generate`), so a row's suffix
sits at positions P, P+1, ... as in the unpadded prompt; greedy outputs equal those of the
left-padded full prompt up to float rounding (identical on real judge prompts:
tests/wim/test_prefix_cache.py, tests/benchmarks/bench_judge.py). The cache lives for one call
only, as the weights may change between calls (a changing judge is the policy being trained);
the prefix is cheap to recompute once per call.
"""

from __future__ import annotations

import os

MIN_PREFIX_TOKENS = 32
"""Below this a shared prefix is not worth the copy (a policy prompt shares only the template)."""


def common_prefix_length(token_lists: list[list[int]]) -> int:
    """Tokens that every list starts with, leaving at least one token of each list after it
    (the model must read one token of its own to predict the next)."""
    if not token_lists:
        return 0
    limit = min(len(ids) for ids in token_lists) - 1
    return max(0, min(limit, len(os.path.commonprefix(token_lists))))  # any sequences, not paths


def shared_prefix_length(token_lists: list[list[int]]) -> int:
    """The prefix every prompt of a call shares; 0 below MIN_PREFIX_TOKENS or with one prompt."""
    length = common_prefix_length(token_lists) if len(token_lists) >= 2 else 0
    return length if length >= MIN_PREFIX_TOKENS else 0


class PrefixCache:
    """The KV cache of one token prefix, computed once, copied per batch."""

    def __init__(self, model, prefix_ids: list[int], adapter_context) -> None:
        import torch
        from transformers import DynamicCache

        self.prefix_ids = list(prefix_ids)
        ids = torch.tensor([self.prefix_ids], dtype=torch.long, device=model.device)
        self.cache = DynamicCache(config=model.config)
        with torch.inference_mode(), adapter_context():
            model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=self.cache,
                  use_cache=True)
        self.config = model.config

    def __len__(self) -> int:
        return len(self.prefix_ids)

    def batch(self, suffixes: list[list[int]], pad_id: int, max_new_tokens: int):
        """(input_ids, attention_mask, cache) for one batch of suffixes after the prefix; the
        cache a `StaticCache` sized for the whole call, the prefix first in every row. (A growing
        cache copies every layer's keys and values at each new token: on a CPU, a third of each
        judge decoding step.)"""
        import torch
        from transformers import StaticCache

        width = max(len(s) for s in suffixes)
        rows, masks = [], []
        for suffix in suffixes:
            pad = width - len(suffix)
            rows.append(self.prefix_ids + [pad_id] * pad + list(suffix))
            masks.append([1] * len(self.prefix_ids) + [0] * pad + [1] * len(suffix))
        device = self.cache.layers[0].keys.device
        input_ids = torch.tensor(rows, dtype=torch.long, device=device)
        attention_mask = torch.tensor(masks, dtype=torch.long, device=device)
        cache = StaticCache(config=self.config, max_cache_len=len(rows[0]) + max_new_tokens)
        for layer, prefix in zip(cache.layers, self.cache.layers, strict=True):
            batch = (len(rows), *prefix.keys.shape[1:])
            layer.update(prefix.keys.expand(batch), prefix.values.expand(batch))
        return input_ids, attention_mask, cache
