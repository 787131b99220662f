"""What the transformers backend hands `generate`: its end tokens, and a sampler that draws
among the tokens top-k and top-p keep (docs/design.md, "Backends").

Decoding is transformers' own `generate`: a loop of our own did not earn its place over it
(tests/benchmarks/results/judge_96_float32.txt, quickstart_loop_deletion.txt). Its sampling is
slow on a CPU twice over: its top-p sorts the whole vocabulary although top-k left about k
tokens, and `torch.multinomial` draws an exponential for every vocabulary entry of every row
(docs/benchmarks.md, "Decoding and sampling"). So `CandidateSampler` draws over the kept tokens
only, with generate's probabilities (tests/wim/test_prefix_cache.py) but its own use of the
random numbers: a seed gives its own tokens, not generate's. With a generation config setting
that it does not apply (`unsupported_settings`), `generate` samples with its own warpers.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

# Settings `generate` would turn into logits processors or stopping rules that our sampler
# does not apply: with any of them away from its default, generate samples with its own.
_NOT_APPLIED = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_length",
                "min_new_tokens", "typical_p", "min_p", "top_h", "epsilon_cutoff", "eta_cutoff",
                "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id",
                "forced_eos_token_id", "exponential_decay_length_penalty", "sequence_bias",
                "renormalize_logits", "watermarking_config", "encoder_repetition_penalty")


def _default(key: str):
    return GenerationConfig._get_default_generation_params().get(key)


def unsupported_settings(config: GenerationConfig) -> list[str]:
    """The settings of a model's generation config that `generate` applies and our sampler not."""
    values = {key: getattr(config, key, None) for key in _NOT_APPLIED}
    return [k for k, v in values.items() if v is not None and v != _default(k) and v is not False]


def end_tokens(config: GenerationConfig) -> list[int]:
    """The end-of-sequence ids of a generation config, as a list (it may hold one int)."""
    ids = config.eos_token_id
    if ids is None:
        return []
    return [int(i) for i in ids] if isinstance(ids, (list, tuple)) else [int(ids)]


def top_k_top_p(scores: torch.Tensor, top_k: int, top_p: float):
    """(values, indices): the tokens transformers' `TopKLogitsWarper` then `TopPLogitsWarper`
    (min_tokens_to_keep 1) keep in each row, kept ones first (the rest of a row at -inf).

    Top-p runs on the k best and every token tied with the k-th (generate's top-k keeps ties
    too; in bfloat16 most steps of a batch have some), not the whole vocabulary. Where ties
    straddle the top-p boundary, which stays depends on the sort, here and in generate alike."""
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
    """A logits processor that samples: generate's temperature, top-k and top-p, then one draw
    over the kept tokens only (over the whole vocabulary with `top_k: 0`). Only the drawn
    token's score stays finite, for `generate` with `do_sample=False`."""

    def __init__(self, config: GenerationConfig, temperature: float, top_p: float) -> None:
        self.temperature = temperature
        # generate's top-k: the generation config's, else its default (50)
        self.top_k = config.top_k if config.top_k is not None else _default("top_k")
        self.top_p = top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """`scores`: the logits after the caller's processors, [rows, vocabulary]."""
        probs, indices = self.candidates(scores)
        picks = torch.multinomial(probs, 1)
        if indices is not None:
            picks = indices.gather(1, picks)
        return torch.full_like(scores, -float("inf")).scatter_(1, picks, 0.0)

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
