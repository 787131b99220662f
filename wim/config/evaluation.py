"""Held-out evaluation: the `blind:` (the blind evaluator) and `eval:` sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from wim.config.endpoints import EndpointConfig
from wim.config.sampling import Backend, Dtype


@dataclass
class BlindConfig:
    """The blind outcome evaluator (wim/blind.py): sees only questions and answers."""

    model: str = "bundled:smollm2-135m-instruct"
    """Evaluator model (`bundled:...`, a folder or a hub id; with `http`, the server's name for it
    unless `blind.http.model` is set)."""
    backend: Backend = "transformers"
    """`transformers`, `llama_cpp` or `http` (its own `blind.http` settings)."""
    dtype: Dtype = "auto"
    """dtype of the evaluator on the transformers backend (see `policy.dtype`)."""
    mode: Literal["pairwise", "pointwise"] = "pairwise"
    """`pairwise` (both orders; disagreement is a tie) or `pointwise` (a 1-10 score each)."""
    verdict: Literal["weighted", "hard"] = "weighted"
    """`weighted`: each order's probabilities of A, B and tie at the verdict token, averaged over
    both orders into a preference in [0, 1] per prompt (docs/design.md, "Blind outcome
    evaluation"); an order without them counts its hard verdict. `hard`: the text alone."""
    max_new_tokens: int = 48
    """Most tokens per verdict (a one-line reason and the verdict)."""
    max_retries: int = 2
    """Re-ask an unparseable verdict this many times, then count it as a failure."""
    retry_temperature: float = 0.7
    """Sampling temperature of the retries (the first attempt is greedy)."""
    seed: int = 0
    """Seed of the evaluator's retries."""
    batch_size: int | None = None
    """Verdicts per batch for a local evaluator; null: 8."""
    http: EndpointConfig = field(default_factory=EndpointConfig)
    """The evaluator's own endpoint when `backend` is `http`, field by field defaulting to
    `http:` (the model name: `blind.http.model`, else `blind.model`)."""


@dataclass
class EvalConfig:
    """`wim eval` / `wim compare`: held-out responses, blind verdicts, statistics."""

    limit: int | None = None
    """Evaluate at most this many held-out prompts; null: all of `prompts.holdout`."""
    max_new_tokens: int | None = None
    """Most tokens of each evaluated response; null: generation.max_new_tokens."""
    temperature: float = 0.0
    """Sampling temperature of the evaluated responses (0 = greedy)."""
    bootstrap_resamples: int = 2000
    """Resamples of the paired bootstrap interval."""
    compare_zetas: list[float] = field(default_factory=lambda: [0.4])
    """`wim compare`: the mixed arms' zetas (numeric 0, WIM 1 and a random control always run)."""
    compare_holdout: int = 50
    """`wim compare`: prompts held out for its evaluation when prompts.holdout is 0. 50 is
    about the fewest on which a real effect can be significant (8, the quickstart size, can
    never be: the smallest Holm-adjusted p of 10 comparisons on 8 prompts is 0.078); set it
    lower only as an explicit small run."""
    in_run: bool = True
    """`wim run`: after training, blind-evaluate the trained policy against its base on the
    held-out prompts (eval.json, atop the report) when prompts.holdout > 0; false: not."""
