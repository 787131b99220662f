"""Experiment configuration: one YAML file loaded into nested dataclasses.

Every field carries its help text. Unknown keys and out-of-range values raise `ConfigError`
with the file and the dotted key, so a typo never silently falls back to a default.
`--set section.key=value` overrides any field (the value is parsed as YAML). Each section's
dataclass lives in the module of the stage that reads it; import any of them from `wim.config`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wim.config.checks import validate
from wim.config.dpo import DPOSection, LoraConfig, TrainingConfig, WandbConfig
from wim.config.endpoints import EndpointConfig, HTTPConfig, PriceConfig, drop_prices, endpoint
from wim.config.evaluation import BlindConfig, EvalConfig
from wim.config.judging import ExportConfig, JudgeConfig, PairsConfig, ScoringConfig
from wim.config.output import CardConfig, ReportConfig
from wim.config.refine import RefineConfig
from wim.config.sampling import GenerationConfig, PolicyConfig, PromptsConfig
from wim.config.yaml_dataclasses import apply_overrides, build_dataclass, read_yaml
from wim.errors import ConfigError

__all__ = ["BlindConfig", "CardConfig", "Config", "ConfigError", "DPOSection", "EvalConfig",
           "ExportConfig", "GenerationConfig", "HTTPConfig", "JudgeConfig", "EndpointConfig",
           "LoraConfig", "PairsConfig", "PolicyConfig", "PriceConfig", "PromptsConfig",
           "RefineConfig", "ReportConfig", "ScoringConfig", "TrainingConfig", "WandbConfig",
           "apply_overrides", "blind_http", "config_from_dict", "endpoint", "judge_http",
           "load_config", "read_yaml", "scoring_http"]


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
    card: CardConfig = field(default_factory=CardConfig)
    """The dataset card of the pairs (its license)."""
    report: ReportConfig = field(default_factory=ReportConfig)
    """The run report (how many prompts report.html's critique browser shows)."""
    refine: RefineConfig = field(default_factory=RefineConfig)
    """`wim refine`: the controlled refinement loop and its stopping policies."""

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data; an endpoint without prices has no `price` key, so that
        a config written before prices existed keeps its sha256 and fingerprints."""
        return drop_prices(dataclasses.asdict(self), unset_only=True)

    def sha256(self) -> str:
        """sha256 of the sorted-key config."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def judge_http(cfg: Config) -> HTTPConfig:
    """The endpoint of an external http judge: `judge.http` over `http:` (see `endpoint`)."""
    return endpoint(cfg.http, cfg.judge.http, cfg.judge.model)


def scoring_http(cfg: Config) -> HTTPConfig:
    """The embeddings server of `scoring.backend: http` (`scoring.http` over `http:`)."""
    return endpoint(cfg.http, cfg.scoring.http)


def blind_http(cfg: Config) -> HTTPConfig:
    """The blind evaluator's server of `blind.backend: http`: `blind.http` over `http:`."""
    return endpoint(cfg.http, cfg.blind.http, cfg.blind.model)


def config_from_dict(data: dict[str, Any], source: str = "config") -> Config:
    cfg = build_dataclass(Config, data or {}, "", source)
    validate(cfg, source)
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config, apply `--set` overrides, validate."""
    data = apply_overrides(read_yaml(path), overrides or [])
    return config_from_dict(data, source=str(path))
