"""Experiment configuration: one YAML file loaded into nested dataclasses.

Every field carries its help text. Unknown keys and out-of-range values raise `ConfigError`
with the file and the dotted key, so a typo never silently falls back to a default.
`--set section.key=value` overrides any field (the value is parsed as YAML).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from wim.config_checks import validate
from wim.errors import ConfigError

__all__ = ["Config", "ConfigError", "apply_overrides", "config_from_dict", "load_config",
           "read_yaml"]


@dataclass
class PromptsConfig:
    source: str = "bundled"
    """`bundled` (64 prompts over 8 domains), a local .jsonl/.csv/.parquet file, or a
    datasets name."""
    split: str = "train"
    """Split to read when `source` is a datasets name."""
    limit: int | None = None
    """Use only the first `limit` prompts (after sharding order is fixed)."""


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


@dataclass
class JudgeConfig:
    role: str = "fixed"
    """`fixed` (frozen reference = base policy with any adapter disabled), `changing` (the
    policy being trained) or `external` (`model` below)."""
    model: str | None = None
    """Model for the external judge (`bundled:...`, a folder or a hub id)."""
    backend: str = "transformers"
    """Backend of the external judge: `transformers`, `llama_cpp` or `http`."""
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
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Optional Weights & Biases logging."""
    export: ExportConfig = field(default_factory=ExportConfig)
    """Where the pairs dataset is also published."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def sha256(self, sections: tuple[str, ...] | None = None) -> str:
        """sha256 of the sorted-key config (or of some sections only)."""
        data = self.to_dict()
        if sections is not None:
            data = {k: data[k] for k in sections}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _build(cls: type, data: Any, path: str, source: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{path or 'top level'}' must be a mapping, got {data!r}.")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(
                f"{source}: unknown key '{dotted}'. Known keys here: {known}. "
                "Check the spelling against configs/quickstart.yaml."
            )
        kwargs[key] = _coerce(hints[key], value, dotted, source)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, key: str, source: str):
    if dataclasses.is_dataclass(hint):
        return _build(hint, value or {}, key, source)
    optional = get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{source}: '{key}' may not be null.")
    base = next(a for a in get_args(hint) if a is not type(None)) if optional else hint
    origin = get_origin(base) or base
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {bool: isinstance(value, bool), int: number and isinstance(value, int), float: number,
          str: isinstance(value, str), list: isinstance(value, list),
          dict: isinstance(value, dict)}.get(origin, True)
    if origin is float and isinstance(value, str):
        # YAML 1.1 reads 1e-5 (no dot) as a string; accept it as the number it means.
        try:
            return float(value)
        except ValueError:
            pass
    if not ok:
        raise ConfigError(f"{source}: '{key}' must be of type {origin.__name__}, got {value!r}.")
    if origin is list and get_args(base):
        return [_coerce(get_args(base)[0], item, f"{key}[{i}]", source)
                for i, item in enumerate(value)]
    return float(value) if origin is float else value


def config_from_dict(data: dict[str, Any], source: str = "config") -> Config:
    cfg = _build(Config, data or {}, "", source)
    validate(cfg, source)
    return cfg


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str = "--set") -> dict:
    """Apply `section.key=value` strings (values parsed as YAML) to a raw config dict."""
    data = json.loads(json.dumps(data))  # deep copy
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: '{item}' must look like section.key=value.")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: '{key}' does not name a config field.")
        node[parts[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist. Try configs/quickstart.yaml.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}).") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections.")
    return data or {}


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config, apply `--set` overrides, validate."""
    data = apply_overrides(read_yaml(path), overrides or [])
    return config_from_dict(data, source=str(path))
