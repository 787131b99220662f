"""The transformers backend's decoding loop: finished rows leave the batch, and sampling draws
over the tokens top-k and top-p keep.

`transformers`' `generate` keeps computing every row until the last one finishes. A judge's
rows finish at very different times (a 10-token critique next to one cut at the length limit),
so on a CPU about a quarter of its decoding steps went into rows that were already done. Here a
finished row is dropped from the batch, its KV cache rows with it (`Cache.reorder_cache`), once
a quarter of the live rows are done (dropping copies the cache, so not after every row). The
loop continues from a `StaticCache`: one pre-filled with a shared prefix (prefix_cache.py), or
an empty one for the whole prompt.

What each step computes is what `generate` (transformers 5.24, `GenerationMixin._sample`)
computes: the logits of the last position in float32; the caller's logits processors; argmax,
or when sampling generate's warpers (temperature, top-k as generate fills it in: the model's
generation config, else its default of 50, top-p) and one draw from the softmax; the end tokens
of the model's generation config (a list: Llama-3 and Qwen list several) and the caller's
stopping criteria. Sampling (`CandidateSampler`) takes generate's probabilities but draws over
the kept tokens only, not over the vocabulary as `torch.multinomial` in `generate` does, so a
seed gives its own tokens, not generate's. tests/wim/test_prefix_cache.py compares greedy
outputs and sampling probabilities with `generate`'s. Settings of a generation config that
this loop does not apply (a repetition penalty, min-p, ...) are named by `unsupported_settings`;
the backend then calls `generate` instead. With `drop_finished=False` it does too, and hands
it `TopKTopP` (generate's top-k and top-p without sorting the vocabulary). Processors and
criteria that keep per-row state (wim/backends/guided.py's `FormatGuide`) are told which rows
stay through their `keep_rows(indices)`.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

PRUNE_FRACTION = 0.25
"""Drop finished rows once they are this share of the live rows (each drop copies the cache)."""

# Settings `generate` would turn into logits processors or stopping rules that this loop has
# not: with any of them away from its default, the loop would compute something else.
_NOT_APPLIED = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_length",
                "min_new_tokens", "typical_p", "min_p", "top_h", "epsilon_cutoff", "eta_cutoff",
                "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id",
                "forced_eos_token_id", "exponential_decay_length_penalty", "sequence_bias",
                "renormalize_logits", "watermarking_config", "encoder_repetition_penalty")


def _default(key: str):
    return GenerationConfig._get_default_generation_params().get(key)


def unsupported_settings(config: GenerationConfig) -> list[str]:
    """The settings of a model's generation config that `generate` applies and `decode` not."""
    found = []
    for key in _NOT_APPLIED:
        value = getattr(config, key, None)
        if value is not None and value != _default(key) and value is not False:
            found.append(key)
    return found


def end_tokens(config: GenerationConfig) -> list[int]:
    """The end-of-sequence ids of a generation config, as a list (it may hold one int)."""
    ids = config.eos_token_id
    if ids is None:
        return []
    return [int(i) for i in ids] if isinstance(ids, (list, tuple)) else [int(ids)]


def sampling_warpers(config: GenerationConfig, temperature: float, top_p: float) -> list:
    """What `generate` appends after the caller's processors when it samples at
    `temperature` and `top_p`: temperature, top-k (from `config`, else generate's default),
    top-p; each only where it changes anything (transformers' `_get_logits_processor`).
    Top-k followed by top-p is one `TopKTopP`: the same scores for less work."""
    top_k = _top_k(config)
    warpers: list = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKTopP(top_k, top_p))
    elif top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p))
    return warpers


def _top_k(config: GenerationConfig) -> int:
    """The top-k generate samples with: the generation config's, else generate's default (50)."""
    return config.top_k if config.top_k is not None else _default("top_k")


class TopKTopP:
    """transformers' `TopKLogitsWarper` then `TopPLogitsWarper` (min_tokens_to_keep 1), over
    the best tokens only. generate's top-p sorts the whole vocabulary and takes its cumulative
    softmax although top-k left about k finite scores; on a CPU that sort and cumsum cost
    ~22 ms a step for 32 rows x 49152 tokens, a third of SmolLM2-135M's forward in bfloat16.
    Here top-p runs on what `topk` returns: the k best, and every token tied with the k-th
    (generate's top-k keeps ties too; in bfloat16 most steps of a batch have some). The same
    scores come out (tests/wim/test_prefix_cache.py), except where tied scores straddle the
    top-p boundary: which of them stays depends on the sort's order of equal values, here and
    in generate alike."""

    def __init__(self, top_k: int, top_p: float) -> None:
        self.top_k = top_k
        self.top_p = top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        values, indices = top_k_top_p(scores, self.top_k, self.top_p)
        return torch.full_like(scores, -float("inf")).scatter_(-1, indices, values)


def top_k_top_p(scores: torch.Tensor, top_k: int, top_p: float):
    """(values, indices): the tokens `TopKTopP` keeps in each row, with their scores, and some
    more at -inf (rows keep different numbers of tokens; a row's kept ones come first)."""
    values, indices = scores.topk(min(top_k, scores.shape[-1]), dim=-1)  # descending
    kth = values[:, -1:]
    # The most tokens a row keeps (finite ones: a processor's -inf ties with nothing).
    tied = int(((scores >= kth) & (scores > -float("inf"))).sum(-1).max())
    if tied > values.shape[-1]:
        values, indices = scores.topk(tied, dim=-1)
        values = values.masked_fill(values < kth, -float("inf"))
    if top_p < 1.0:
        # generate's rule on the ascending order: drop tokens whose cumulative probability
        # is at most 1 - top_p, never the most likely one.
        ascending = values.flip(-1)
        remove = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        remove[:, -1] = False
        values = values.masked_fill(remove.flip(-1), -float("inf"))
    return values, indices


class CandidateSampler:
    """generate's sampling (temperature, top-k, top-p as `sampling_warpers` builds them, then
    one draw from the softmax) with the draw over the tokens top-k and top-p keep, not the
    whole vocabulary: `torch.multinomial` draws an exponential for every entry of its input,
    ~30 ms a step for 32 rows x 49152 tokens on a CPU, as long as SmolLM2-135M's whole forward
    in bfloat16. The probabilities are generate's (tests/wim/test_prefix_cache.py); the random
    numbers are used otherwise, so a seed draws other tokens than in `generate`, and the same
    ones again here. Without a top-k (a generation config with `top_k: 0`) it draws over the
    whole vocabulary."""

    def __init__(self, config: GenerationConfig, temperature: float, top_p: float) -> None:
        self.temperature = temperature
        self.top_k = _top_k(config)
        self.top_p = top_p

    def __call__(self, scores: torch.Tensor, live: torch.Tensor, rows: int) -> torch.Tensor:
        """One token for each of the `live` rows (their indices among `rows`) from `scores`,
        the logits after the caller's processors."""
        probs, indices = self.candidates(scores)
        picks = _draw(probs, live, rows)
        return picks if indices is None else indices.gather(1, picks[:, None]).squeeze(1)

    def candidates(self, scores: torch.Tensor):
        """(probs, indices): each row's sampling probabilities over the tokens in `indices`
        (None: over the whole vocabulary); 0 for the tokens top-k or top-p removed."""
        if self.temperature != 1.0:
            scores = TemperatureLogitsWarper(self.temperature)(None, scores)
        if self.top_k:
            values, indices = top_k_top_p(scores, self.top_k, self.top_p)
            return values.softmax(dim=-1), indices
        if self.top_p < 1.0:
            scores = TopPLogitsWarper(top_p=self.top_p)(None, scores)
        return scores.softmax(dim=-1), None


def decode(model, input_ids, attention_mask, cache, *, cached: int, max_new_tokens: int,
           eos_ids: list[int], pad_id: int, temperature: float = 0.0, top_p: float = 1.0,
           processors=(), criteria=()) -> torch.Tensor:
    """New tokens for each row of `input_ids` ([rows, max_new_tokens], `pad_id` after a row's
    end), continuing from `cache`, which already holds the first `cached` positions.

    `attention_mask` marks the real tokens of `input_ids` (it may have holes: a shared prefix,
    padding, then the row's own tokens); position ids follow from it, as in `generate`.
    `cache` must have room for `input_ids` and `max_new_tokens` more (a `StaticCache`).
    `temperature` 0 is greedy; otherwise `CandidateSampler` samples, with the top-k of
    `model.generation_config`.
    """
    rows, width = input_ids.shape
    device = input_ids.device
    mask = torch.zeros(rows, width + max_new_tokens, dtype=attention_mask.dtype, device=device)
    mask[:, :width] = attention_mask
    positions = attention_mask.long().cumsum(-1) - 1
    sampling = temperature > 0
    sample = CandidateSampler(model.generation_config, temperature, top_p) if sampling else None
    ends = torch.tensor(eos_ids, dtype=torch.long, device=device)
    out = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    live = torch.arange(rows, device=device)  # original row of each row still in the batch
    sequences = input_ids
    step_ids = input_ids[:, cached:]
    step_positions = positions[:, cached:].clamp(min=0)
    done_since_prune = torch.zeros(rows, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        logits = model(input_ids=step_ids, attention_mask=mask,
                       position_ids=step_positions, cache=cache, use_cache=True,
                       logits_to_keep=1).logits
        scores = logits[:, -1, :].to(torch.float32)
        for processor in processors:
            scores = processor(sequences, scores)
        if sample is not None:
            tokens = sample(scores, live, rows)
        else:
            tokens = scores.argmax(dim=-1)
        # A finished row still in the batch writes padding, as in `generate`.
        tokens = tokens.masked_fill(done_since_prune, pad_id)
        out[live, step] = tokens
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        finished = done_since_prune | torch.isin(tokens, ends)
        for criterion in criteria:
            finished |= criterion(sequences, scores).to(device)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        mask[:, width + step] = 1
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


def _draw(probs: torch.Tensor, live: torch.Tensor, rows: int) -> torch.Tensor:
    """One multinomial draw per live row, made over a batch of all `rows` rows (dropped rows
    uniform): torch draws each row from the random stream by its place in the batch, so a
    row's tokens do not depend on when the rows before it left."""
    if len(live) == rows:
        return torch.multinomial(probs, 1).squeeze(1)
    full = torch.full((rows, probs.shape[1]), 1.0 / probs.shape[1], dtype=probs.dtype,
                      device=probs.device)
    full[live] = probs
    return torch.multinomial(full, 1).squeeze(1)[live]
