"""The run directory: the contract between stages (see DESIGN.md).

`resolved_config.yaml` records the config after overrides, its sha256, package versions and the
git sha. The sections that decide which samples and judgements exist (the "data" sections) must
match for a second run in the same folder; otherwise the run is refused before anything is
written. Downstream sections (scoring, pairs, lora, dpo, ...) may change: the stages that
depend on them are recomputed from the records already there.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from wim.config import Config, ConfigError, config_from_dict
from wim.errors import WimError

DATA_SECTIONS = ("seed", "prompts", "policy", "generation", "judge")
# Keys inside the data sections that only change how existing judgements are scored.
SCORING_KEYS = ("judge.on_parse_failure",)
_PACKAGES = ("wim", "torch", "transformers", "trl", "peft", "datasets", "sentence-transformers",
             "accelerate")


class RunDirError(WimError):
    pass


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config_file(self) -> Path:
        return self.path / "resolved_config.yaml"

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def samples(self) -> Path:
        return self.path / "samples.jsonl"

    @property
    def judgements(self) -> Path:
        return self.path / "judgements.jsonl"

    @property
    def scores(self) -> Path:
        return self.path / "scores.jsonl"

    @property
    def pairs(self) -> Path:
        return self.path / "pairs.jsonl"

    def read_meta(self) -> dict | None:
        if not self.config_file.exists():
            return None
        return yaml.safe_load(self.config_file.read_text())

    def load_config(self) -> Config:
        meta = self.read_meta()
        if meta is None:
            raise RunDirError(
                f"{self.path} holds no run (no resolved_config.yaml). Start one with "
                f"`wim run CONFIG --out {self.path}`."
            )
        return config_from_dict(meta["config"], source=str(self.config_file))

    def shard(self) -> str | None:
        meta = self.read_meta()
        return meta.get("shard") if meta else None

    def claim(self, cfg: Config, shard: str | None = None) -> None:
        """Create the folder or check that it holds a run of the same data config."""
        meta = self.read_meta()
        if meta is not None:
            old = config_from_dict(meta["config"], source=str(self.config_file))
            same = (old.sha256(DATA_SECTIONS, SCORING_KEYS)
                    == cfg.sha256(DATA_SECTIONS, SCORING_KEYS))
            if not same or meta.get("shard") != shard:
                changed = [k for k in _changed_keys(old.to_dict(), cfg.to_dict(), DATA_SECTIONS)
                           if k not in SCORING_KEYS]
                if meta.get("shard") != shard:
                    changed.append(f"shard ({meta.get('shard')} -> {shard})")
                raise RunDirError(
                    f"{self.path} already holds a run with a different config "
                    f"(changed: {', '.join(changed)}). Nothing was written. Use another --out "
                    "folder, or re-run with the config saved in "
                    f"{self.config_file}."
                )
        self.path.mkdir(parents=True, exist_ok=True)
        if meta is None:
            self.save_config(cfg, shard)
        # An existing run keeps its saved config until the new stages succeed (the caller then
        # saves it), so a failed re-score never leaves a config that does not match the files.

    def save_config(self, cfg: Config, shard: str | None = None) -> None:
        meta = {
            "config": cfg.to_dict(),
            "sha256": cfg.sha256(),
            "data_sha256": cfg.sha256(DATA_SECTIONS, SCORING_KEYS),
            "shard": shard,
            "versions": package_versions(),
            "git_sha": git_sha(),
        }
        tmp = self.config_file.with_suffix(".yaml.tmp")
        tmp.write_text(yaml.safe_dump(meta, sort_keys=False))
        tmp.replace(self.config_file)


def _changed_keys(old: dict, new: dict, sections: tuple[str, ...]) -> list[str]:
    changed = []
    for section in sections:
        a, b = old.get(section), new.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            changed += [f"{section}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            changed.append(section)
    return changed


def package_versions() -> dict[str, str]:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


__all__ = ["RunDir", "RunDirError", "ConfigError", "DATA_SECTIONS"]
