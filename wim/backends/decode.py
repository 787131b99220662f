"""A decoding loop whose rows leave the batch as they finish, for batches after a shared prefix.

`transformers`' `generate` keeps computing every row until the last one finishes. A judge's
rows finish at very different times (a 10-token critique next to one cut at the length limit),
so on a CPU about a quarter of its decoding steps went into rows that were already done. Here a
finished row is dropped from the batch, its KV cache rows with it (`Cache.reorder_cache`), once
a quarter of the live rows are done (dropping copies the cache, so not after every row).

What each step computes is what `generate` computes: the logits of the last position in
float32, the warpers of `transformers` (temperature, top-p), then the caller's logits
processors, argmax or a multinomial draw, and the caller's stopping criteria. Greedy outputs
equal `generate`'s up to float rounding (tests/wim/test_prefix_cache.py compares them).
Processors and criteria that keep per-row state (wim/backends/guided.py's `FormatGuide`) are
told which rows stay through their `keep_rows(indices)`.
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

PRUNE_FRACTION = 0.25
"""Drop finished rows once they are this share of the live rows (each drop copies the cache)."""


def decode(model, input_ids, attention_mask, cache, *, cached: int, max_new_tokens: int,
           eos_id: int | None, pad_id: int, temperature: float = 0.0, top_p: float = 1.0,
           processors=(), criteria=()) -> torch.Tensor:
    """New tokens for each row of `input_ids` ([rows, max_new_tokens], `pad_id` after a row's
    end), continuing from `cache`, which already holds the first `cached` positions.

    `attention_mask` marks the real tokens of `input_ids` (it may have holes: a shared prefix,
    padding, then the row's own tokens); position ids follow from it, as in `generate`.
    `cache` must have room for `input_ids` and `max_new_tokens` more (a `StaticCache`).
    """
    rows, width = input_ids.shape
    device = input_ids.device
    capacity = width + max_new_tokens
    mask = torch.zeros(rows, capacity, dtype=attention_mask.dtype, device=device)
    mask[:, :width] = attention_mask
    positions = attention_mask.long().cumsum(-1) - 1
    warpers = []
    if temperature > 0:
        warpers.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
    out = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    live = torch.arange(rows, device=device)  # original row of each row still in the batch
    sequences = input_ids
    step_ids = input_ids[:, cached:]
    step_positions = positions[:, cached:].clamp(min=0)
    done_since_prune = torch.zeros(rows, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        start = cached if step == 0 else width + step - 1
        end = width + step
        logits = model(input_ids=step_ids, attention_mask=mask,
                       position_ids=step_positions, cache=cache, use_cache=True,
                       cache_position=torch.arange(start, end, device=device),
                       logits_to_keep=1).logits
        scores = logits[:, -1, :].to(torch.float32)
        for warper in warpers:
            scores = warper(sequences, scores)
        for processor in processors:
            scores = processor(sequences, scores)
        if temperature > 0:
            tokens = torch.multinomial(torch.softmax(scores, dim=-1), 1).squeeze(1)
        else:
            tokens = scores.argmax(dim=-1)
        # A finished row still in the batch writes padding, as in `generate`.
        tokens = tokens.masked_fill(done_since_prune, pad_id)
        out[live, step] = tokens
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        finished = done_since_prune.clone()
        if eos_id is not None:
            finished |= tokens == eos_id
        for criterion in criteria:
            finished |= criterion(sequences, scores).to(device)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        mask[:, end] = 1
        step_ids = tokens[:, None]
        step_positions = positions[:, -1:] + 1
        positions = torch.cat([positions, step_positions], dim=1)
        done_since_prune = finished
        if int(finished.sum()) >= max(1, PRUNE_FRACTION * len(live)):
            keep = (~finished).nonzero().squeeze(1)
            cache.reorder_cache(keep)
            live, sequences, mask, positions = (t[keep] for t in (live, sequences, mask, positions))
            step_ids, step_positions = sequences[:, -1:], positions[:, -1:]
            for stateful in (*processors, *criteria):
                if hasattr(stateful, "keep_rows"):
                    stateful.keep_rows(keep.tolist())
            done_since_prune = torch.zeros(len(keep), dtype=torch.bool, device=device)
    return out
