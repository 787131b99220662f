"""Experiment configuration: one YAML file loaded into nested dataclasses.

Every field carries its help text. Unknown keys and out-of-range values raise `ConfigError`
with the file and the dotted key, so a typo never silently falls back to a default.
`--set section.key=value` overrides any field (the value is parsed as YAML).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wim.config_checks import validate
from wim.errors import ConfigError
from wim.refine.config import RefineConfig
from wim.yaml_dataclasses import apply_overrides, build_dataclass, read_yaml

__all__ = ["Config", "ConfigError", "apply_overrides", "config_from_dict", "judge_http",
           "load_config", "read_yaml"]


@dataclass
class PromptsConfig:
    source: str = "bundled"
    """`bundled` (64 prompts over 8 domains), a local .jsonl/.csv/.parquet file, or a
    datasets name."""
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
    backend: str = "transformers"
    """`transformers`, `llama_cpp` (CPU-fast, GGUF) or `http` (OpenAI-compatible server)."""
    adapter: str | None = None
    """A trained LoRA adapter folder (e.g. `RUN/train/adapter`) put onto `model` by transformers'
    `load_adapter` (transformers backend only): the changing judge runs with it, the fixed judge
    without it. `wim train` still trains a fresh adapter on `model`."""
    dtype: str = "auto"
    """What the local model computes in (sampling, the fixed and changing judges, training):
    `auto` (bfloat16 on CUDA and on CPUs that compute it natively, AMX or AVX512-BF16; float32
    on other CPUs, where bfloat16 is emulated and slower), `float32` or `bfloat16`. Training in
    bfloat16 is mixed precision: bfloat16 compute, float32 adapter weights. The run records what
    `auto` resolved to; a resumed run refuses another dtype."""


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
    overlong: str = "truncate"
    """A prompt longer than the policy's context (less max_new_tokens) or max_prompt_tokens:
    `truncate` (cut from the middle to fit, counted as generate/truncated) or `skip` (not
    sampled, counted as generate/skipped_overlong)."""
    max_prompt_tokens: int | None = None
    """Cap on prompt tokens below the model's context (long prompts are slow); null: none."""
    source: str | None = None
    """Existing responses to judge instead of sampling (wim/sources.py): a .jsonl/.json/.csv/
    .parquet file, a folder saved with `save_to_disk`, or a datasets name. The prompts come
    with it (prompts.source stays `bundled`; prompts.limit still applies); the settings above
    are then unused and no policy samples. null: the policy samples k responses per prompt."""
    source_split: str = "train"
    """Split to read when `source` is a datasets name or a saved DatasetDict."""
    source_shape: str = "auto"
    """`responses` (a prompt and a list of responses), `ultrafeedback` (a prompt and
    `completions`: objects with a model name, a response and a rating), `preference` (prompt,
    chosen, rejected: each side becomes a sample and keeps its label), or `auto` (by columns)."""
    source_columns: dict[str, str] = field(default_factory=dict)
    """Column and key names where the source differs: prompt (default `prompt`, else
    `instruction`), id, domain, responses, completions, model, response, rating
    (`overall_score`), chosen, rejected. E.g. `{prompt: question, rating: fine-grained_score}`."""


@dataclass
class HTTPConfig:
    base_urls: list[str] = field(default_factory=list)
    """OpenAI-compatible endpoints (…/v1), used round-robin."""
    model: str = ""
    """Model name sent in each request (the server's name for it)."""
    api_key_env: str = "WIM_API_KEY"
    """Environment variable holding the API key; the key itself never goes into a config."""
    concurrency: int = 8
    """Requests in flight at once, over all URLs."""
    timeout_s: float = 60.0
    """Seconds to wait for one reply before it counts as a timeout (and is retried)."""
    max_retries: int = 4
    """Retries with exponential backoff on timeouts, 429 and 5xx."""
    context_tokens: int | None = None
    """The server model's context length, if known. Without a tokenizer, a prompt's length is
    estimated as characters / 3 (on the safe side); null: no check, the server decides."""
    adapter_serving: str = "none"
    """`vllm`: after each round's training the run registers the new LoRA adapter with the
    server (`POST /v1/load_lora_adapter`; vLLM with `--enable-lora` and
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) under a name unique to the run and round, and the
    next round samples by that name (so `training.rounds` > 1 works with an http policy); the
    changing judge uses it too, the fixed judge the base `model`. `wim eval` / `wim compare`
    generate each system's answers by its adapter's name. `none`: adapters stay local."""
    server_paths: dict[str, str] = field(default_factory=dict)
    """With `adapter_serving`: how the server sees this machine's folders (a shared mount), as
    {local prefix: server prefix}, e.g. {/work/runs: /mnt/runs}. An adapter folder under a
    local prefix is sent with the server's prefix instead; empty: the same paths."""


@dataclass
class JudgeHTTPConfig:
    """`judge.http`: the judge's own OpenAI-compatible endpoint; each field left null takes its
    value from the `http:` section (the policy's)."""

    base_urls: list[str] | None = None
    """The judge's endpoints (…/v1); null: `http.base_urls`."""
    model: str | None = None
    """The judge server's name for its model; null: `judge.model`, else `http.model`."""
    api_key_env: str | None = None
    """Environment variable holding the judge server's API key; null: `http.api_key_env`."""
    concurrency: int | None = None
    """Judge requests in flight at once; null: `http.concurrency`."""
    timeout_s: float | None = None
    """Seconds per judge reply; null: `http.timeout_s`."""
    max_retries: int | None = None
    """Retries of a judge request; null: `http.max_retries`."""
    context_tokens: int | None = None
    """The judge model's context length; null: `http.context_tokens`."""


@dataclass
class JudgeConfig:
    role: str = "fixed"
    """`fixed` (frozen reference = base policy with any adapter disabled), `changing` (the
    policy being trained) or `external` (`model` below)."""
    model: str | None = None
    """Model for the external judge (`bundled:...`, a folder or a hub id)."""
    backend: str = "transformers"
    """Backend of the external judge: `transformers`, `llama_cpp` or `http`."""
    dtype: str = "auto"
    """dtype of an external judge on the transformers backend (see `policy.dtype`)."""
    mode: str = "wim"
    """`wim`: critique of what is missing plus a rating; `numeric`: rating only (cheaper)."""
    prompt: str = "ours"
    """`ours`: "Missing: ..." then "Rating: N" (a small judge is walked through it). `authors`: the
    WIM authors' structure in our words: a short explanation, `[[N]]`, then what is missing as
    `[[[...]]]` (`[[[]]]` = nothing), instructions in the system turn. Both are parsed."""
    on_parse_failure: str = "exclude"
    """`exclude`: a judgement that fails to parse (after retries) gets no score. `authors` (their
    code): an unparseable rating counts as rating_norm 0, a missing critique leaves the rating
    alone as the score; both counted (`score/fallback_rating`, `score/fallback_critique`)."""
    criteria: str = (
        "accuracy, completeness, and the specific facts, steps or caveats a careful expert "
        "would include"
    )
    """What the judge weighs, written into the judge prompt (set it per dataset)."""
    instructions_in: str = "system"
    """Where the judge instructions go: `system` or `user` message."""
    max_new_tokens: int = 64
    """Most tokens the judge may write per judgement (critique and rating together)."""
    max_retries: int = 2
    """Re-ask a judge whose output fails to parse this many times (sampling, new seed)."""
    retry_temperature: float = 0.7
    """Sampling temperature of the retries (the first attempt is greedy)."""
    batch_size: int = 8
    """Judgements per batch for a local judge."""
    overlong: str = "truncate"
    """Judge input (instructions + prompt + response) longer than the judge's context (less
    max_new_tokens) or max_input_tokens: `truncate` (the prompt is cut from the middle, the
    response kept whole; judge/truncated) or `skip` (not judged; judge/skipped_overlong)."""
    max_input_tokens: int | None = None
    """Cap on judge input tokens below the judge's context; null: none."""
    guided_json: bool = True
    """HTTP judge: ask the server for the verdict as JSON matching the judge's schema
    (`response_format`; vLLM, SGLang, llama.cpp, OpenAI), falling back to plain text where the
    server refuses it (`http/judge/guided_refused`). false: plain text only."""
    http: JudgeHTTPConfig = field(default_factory=JudgeHTTPConfig)
    """The external http judge's own endpoint (`judge.backend: http`), field by field
    defaulting to `http:`; then the policy samples on one server and the judge answers on
    another. Fixed and changing judges are the policy and answer where it does."""


@dataclass
class ScoringConfig:
    zeta: float = 0.4
    """score = (1 - zeta) * rating_norm + zeta * similarity; 1 = pure WIM, 0 = pure numeric."""
    embedder: str = "bundled:all-minilm-l6-v2"
    """sentence-transformers model E: `bundled:all-minilm-l6-v2` (fast), `bundled:all-mpnet-base-v2`
    (the authors' choice, about 6x slower on CPU), a local folder or a hub id."""
    report_zetas: list[float] = field(default_factory=lambda: [0.0, 0.4, 1.0])
    """zetas reported side by side (all from one judging pass)."""
    batch_size: int = 64
    """Texts per embedder batch."""


@dataclass
class PairsConfig:
    strategy: str = "best_vs_worst"
    """`best_vs_worst`, `best_vs_random` (best vs a random lower sample) or `all` (all
    non-tied pairs)."""
    tie_policy: str = "drop"
    """When the best and worst tie: `drop` the prompt, keep the `first` sample order, or pick
    at `random`."""
    tie_tolerance: float = 1e-6
    """Two samples tie when their scores differ by at most this on the 1-10 scale (`x * 5 + 5`:
    0.5 here is 0.1 on the raw [-1, 1] score). One rule for the pairs and the report."""


@dataclass
class LoraConfig:
    """The LoRA adapter DPO trains (peft.LoraConfig)."""

    r: int = 8
    """Rank of the low-rank update."""
    alpha: int = 16
    """Scaling numerator: the update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input during training."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Names of the linear layers that get an adapter."""


@dataclass
class DPOSection:
    """Passed to `trl.DPOConfig` (plus `extra` for any other DPOConfig field)."""

    learning_rate: float = 5e-5
    """Peak learning rate of the adapter weights."""
    beta: float = 0.1
    """DPO beta: how far the policy may move from the reference (larger = closer)."""
    max_steps: int = 8
    """Optimizer steps to train."""
    per_device_train_batch_size: int = 4
    """Pairs per step (before gradient accumulation)."""
    gradient_accumulation_steps: int = 1
    """Steps whose gradients are summed before one optimizer update."""
    max_length: int = 256
    """Most tokens of prompt plus response; longer pairs are truncated."""
    logging_steps: int = 1
    """Log the loss every this many steps."""
    save_steps: int = 25
    """Save a checkpoint every this many steps (and at the end), so that a killed training
    resumes from its last checkpoint when the same command runs again; 0: no checkpoints."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Any other trl.DPOConfig field, by its name (checked against the installed TRL)."""


@dataclass
class BlindConfig:
    """The blind outcome evaluator (wim/blind.py): sees only questions and answers."""

    model: str = "bundled:smollm2-135m-instruct"
    """Evaluator model (`bundled:...`, a folder or a hub id; with `http`, `http.model`)."""
    backend: str = "transformers"
    """`transformers`, `llama_cpp` or `http` (its own `blind.http` settings)."""
    dtype: str = "auto"
    """dtype of the evaluator on the transformers backend (see `policy.dtype`)."""
    mode: str = "pairwise"
    """`pairwise` (both orders; disagreement is a tie) or `pointwise` (a 1-10 score each)."""
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
    http: HTTPConfig = field(default_factory=HTTPConfig)
    """OpenAI-compatible endpoint of the evaluator when `backend` is `http`."""


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
    """`wim run`: after training, the blind evaluation of the trained policy against its base
    on the held-out prompts (the `eval` stage: eval.json, shown at the top of the report).
    Runs only when prompts.holdout > 0; false switches it off."""


@dataclass
class TrainingConfig:
    """How training feeds back into sampling and judging (rounds), and where it runs."""

    rounds: int = 1
    """Iterations of sample -> judge -> score -> pairs -> train. In round r the policy is the
    base plus the adapter of round r-1; the changing judge judges with that adapter on, the
    fixed judge with it off. 1: one pass in the run directory itself; more: DIR/rounds/<r>/."""
    adapter: str = "continue"
    """Each round after the first: `continue` training the previous round's adapter (its
    reference is that adapter's state at the round's start) or train a `fresh` one on the base
    (the next round's policy is base + the fresh adapter)."""
    mode: str = "offline"
    """`offline`: DPO on the pairs of each round (trl.DPOTrainer). `online`: TRL's
    OnlineDPOTrainer samples 2 completions per prompt each step and the WIM score of the judge
    (judge.role fixed: adapter off; changing: the live model) is its reward."""
    online_tie_policy: str = "drop"
    """Online mode, two completions that tie (pairs.tie_tolerance): `drop` the pair from the
    loss, or take the `first` as chosen (TRL's own rule, and the authors' code). Counted."""
    online_max_new_tokens: int = 64
    """Online mode: most tokens per sampled completion (the paper: 256)."""
    online_temperature: float = 0.9
    """Online mode: sampling temperature of the two completions (the paper: 0.9)."""
    load_in_4bit: bool = False
    """QLoRA: load the policy's base weights in 4 bit (bitsandbytes, CUDA only)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about 30% more time."""


@dataclass
class WandbConfig:
    enabled: bool = False
    """Log training and the report's metrics to Weights & Biases."""
    project: str = "wim"
    """The wandb project name."""


@dataclass
class ExportConfig:
    push_to_hub: str | None = None
    """Hub repo id to push the pairs dataset to (needs network and a token)."""


@dataclass
class Config:
    """One experiment: every section of the YAML file."""

    seed: int = 0
    """Seeds sampling, judging retries, random tie-breaks and training."""
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    """Which prompts to sample for."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The model that samples responses (and is trained)."""
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    """How the policy samples k responses per prompt."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Who judges each response, and how."""
    http: HTTPConfig = field(default_factory=HTTPConfig)
    """OpenAI-compatible endpoints, for any backend set to `http`."""
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    """The WIM score formula and its embedder."""
    pairs: PairsConfig = field(default_factory=PairsConfig)
    """How scored samples become chosen/rejected pairs."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """The LoRA adapter DPO trains."""
    dpo: DPOSection = field(default_factory=DPOSection)
    """TRL DPO training settings."""
    blind: BlindConfig = field(default_factory=BlindConfig)
    """The blind outcome evaluator of `wim eval` and `wim compare`."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation settings of `wim eval` and `wim compare`."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Rounds, offline or online DPO, QLoRA and gradient checkpointing."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Optional Weights & Biases logging."""
    export: ExportConfig = field(default_factory=ExportConfig)
    """Where the pairs dataset is also published."""
    refine: RefineConfig = field(default_factory=RefineConfig)
    """`wim refine`: the controlled refinement loop and its stopping policies."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def sha256(self, sections: tuple[str, ...] | None = None) -> str:
        """sha256 of the sorted-key config (or of some sections only)."""
        data = self.to_dict()
        if sections is not None:
            data = {k: data[k] for k in sections}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def judge_http(cfg: Config) -> HTTPConfig:
    """The endpoint settings of an external http judge: `judge.http`, each null field taken
    from `http` (the model name: `judge.http.model`, else `judge.model`, else `http.model`)."""
    own = cfg.judge.http
    merged = {f.name: getattr(own, f.name) if getattr(own, f.name) is not None
              else getattr(cfg.http, f.name) for f in dataclasses.fields(JudgeHTTPConfig)}
    merged["model"] = own.model or cfg.judge.model or cfg.http.model
    # Adapters are served by the policy's server only (fixed and changing judges run there).
    return dataclasses.replace(cfg.http, **merged, adapter_serving="none", server_paths={})


def config_from_dict(data: dict[str, Any], source: str = "config") -> Config:
    cfg = build_dataclass(Config, data or {}, "", source)
    validate(cfg, source)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config, apply `--set` overrides, validate."""
    data = apply_overrides(read_yaml(path), overrides or [])
    return config_from_dict(data, source=str(path))
