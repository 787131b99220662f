"""What is sampled: the `prompts:`, `policy:` and `generation:` sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

Dtype = Literal["auto", "float32", "bfloat16"]
"""Compute dtypes of every model section (`auto`: wim/precision.py decides)."""
DTYPES = get_args(Dtype)
Backend = Literal["transformers", "llama_cpp", "http"]
"""Where a model runs: policy, external judge, blind evaluator and cross-model E_L."""
Overlong = Literal["truncate", "skip"]
"""What `generation.overlong` and `judge.overlong` do with a text over the context."""
SOURCE_COLUMN_KEYS = ("prompt", "id", "domain", "responses", "completions", "model", "response",
                      "rating", "chosen", "rejected")
"""The keys of `generation.source_columns`: a source's column names for each."""


@dataclass
class PromptsConfig:
    source: str = "bundled"
    """`bundled` (64 prompts over 8 domains), a .jsonl/.csv/.parquet file or a datasets name."""
    split: str = "train"
    """Split to read when `source` is a datasets name."""
    limit: int | None = None
    """Use only the first `limit` prompts (after sharding order is fixed)."""
    holdout: int = 0
    """Prompts held out of generation, judging and training for `wim eval` (chosen per domain by
    a fixed hash of the prompt id, before `limit`; recorded in DIR/split.json)."""


@dataclass
class PolicyConfig:
    model: str = "bundled:smollm2-135m-instruct"
    """The policy that samples responses: `bundled:...`, a local folder or a hub id."""
    backend: Backend = "transformers"
    """`transformers`, `llama_cpp` (CPU-fast, GGUF) or `http` (OpenAI-compatible server)."""
    adapter: str | None = None
    """A trained LoRA adapter folder (e.g. `RUN/train/adapter`) put onto `model` by transformers'
    `load_adapter` (transformers backend only): the changing judge runs with it, the fixed judge
    without it. `wim train` still trains a fresh adapter on `model`."""
    dtype: Dtype = "auto"
    """What the local model computes in (sampling, fixed and changing judges, training): `auto`
    (bfloat16 where the device computes it natively, else float32; wim/precision.py),
    `float32` or `bfloat16` (training: float32 adapter weights). The run records what `auto`
    resolved to; a resumed run refuses another dtype."""


@dataclass
class GenerationConfig:
    k: int = 2
    """Samples per prompt (at least 2, so that each prompt can give a pair)."""
    max_new_tokens: int = 64
    """Most tokens a sampled response may have."""
    temperature: float = 0.8
    """Sampling temperature of the policy (0 = greedy, which makes the k samples identical)."""
    top_p: float = 0.95
    """Nucleus sampling: sample from the smallest token set whose probability reaches top_p."""
    batch_size: int = 8
    """Prompts per batch; batches are fixed by the prompt order, so resumed and sharded runs
    reproduce the same samples."""
    overlong: Overlong = "truncate"
    """A prompt over the policy's context (less max_new_tokens) or max_prompt_tokens: `truncate`
    (cut from the middle; generate/truncated) or `skip` (generate/skipped_overlong)."""
    max_prompt_tokens: int | None = None
    """Cap on prompt tokens below the model's context (long prompts are slow); null: none."""
    source: str | None = None
    """Existing responses to judge instead of sampling (docs/design.md, "Responses from a
    source"): a file, a `save_to_disk` folder or a datasets name; the prompts come with it
    (prompts.limit still applies). null: the policy samples k responses per prompt."""
    source_split: str = "train"
    """Split to read when `source` is a datasets name or a saved DatasetDict."""
    source_shape: Literal["auto", "responses", "ultrafeedback", "preference"] = "auto"
    """`responses`, `ultrafeedback` or `preference` (each side a sample that keeps its label),
    or `auto` (by columns); wim/sources.py describes each."""
    source_columns: dict[str, str] = field(default_factory=dict)
    """Column and key names where the source differs: prompt (default `prompt`, else
    `instruction`), id, domain, responses, completions, model, response, rating
    (`overall_score`), chosen, rejected. E.g. `{prompt: question, rating: fine-grained_score}`."""
