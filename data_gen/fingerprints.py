"""Stage fingerprints: finished work is not redone (docs/design.md, "The run directory"). A
stage that lost records to backend failures is never fingerprinted, so the next run retries it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from wim.config import Config
from wim.records import storage_error
from wim.rundir import ADAPTER_WEIGHTS, RunDir, identity
from wim.stages import Stage, stage_inputs


def file_sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prompts_sha256(prompts) -> str:
    data = [(p.id, p.domain, list(p.messages)) for p in prompts]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def input_fingerprint(cfg: Config, run: RunDir, stage: Stage, shard: str | None,
                      prompts_sha: str | None) -> str:
    """sha256 of everything `stage` reads: config, shard, prompts, input files."""
    data = cfg.to_dict()  # prices only where set: scoring.http and blind.http take none
    what = {
        "stage": stage.name,
        "identity": identity(cfg),
        # A section (`scoring`) or one key of one (`judge.on_parse_failure`).
        "sections": {name: _lookup(data, name) for name in stage.sections},
        "shard": shard,
        "prompts": prompts_sha if stage.reads_prompts else None,
        "inputs": {name: file_sha256(run.file(name)) for name in _inputs(run, stage)},
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _lookup(data: dict, dotted: str) -> Any:
    """`data`'s value at a dotted key; None where there is none (a price left unset)."""
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _inputs(run: RunDir, stage: Stage) -> list[str]:
    """The stage's input files; the eval stage of a run of several rounds also reads every
    round's adapter (the last one is the policy it evaluates)."""
    names = list(stage_inputs(stage))
    if stage.name == "eval" and run.rounds_folder.is_dir():
        names += sorted(str(p.relative_to(run.path)) for p in
                        run.rounds_folder.glob(f"*/{ADAPTER_WEIGHTS}"))
    return names


def _outputs(run: RunDir, stage: Stage) -> dict[str, str | None]:
    return {name: file_sha256(run.file(name)) for name in stage.outputs}


def finished_stats(run: RunDir, stage: Stage, fingerprint: str) -> dict[str, Any] | None:
    """The saved stats of `stage` if it finished with this fingerprint, outputs untouched."""
    path = run.stats_file(stage.name)
    try:
        stats = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    saved = stats.pop("fingerprint", None) or {}
    outputs = _outputs(run, stage)
    if (saved.get("inputs") != fingerprint or saved.get("outputs") != outputs
            or any(v is None for v in outputs.values())):
        return None
    return stats


def record_finished(run: RunDir, stage: Stage, fingerprint: str) -> None:
    """Add the fingerprint to `stats/<stage>.json` (created for stages without stats)."""
    path = run.stats_file(stage.name)
    try:
        stats = json.loads(path.read_text()) if path.exists() else {}
        stats["fingerprint"] = {"inputs": fingerprint, "outputs": _outputs(run, stage)}
        run.write_stats(stage.name, stats)
    except OSError as err:
        raise storage_error(err, path) from None
