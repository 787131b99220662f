"""`training.rounds`: sample -> judge -> score -> pairs -> train, R times, the judge changing.

Round r is a run directory of its own, `DIR/rounds/<r>/` (the same contract: its own
resolved_config.yaml, samples, judgements, scores, pairs, train/, stats/ and fingerprints,
report.json), whose config is the run's with `policy.adapter` set to round r-1's adapter (an
absolute path). So in round r the policy samples with that adapter on, the changing judge
judges with it on and the fixed judge with it off (`adapters_off`); training continues it
(`training.adapter: continue`) or trains a fresh one on the base. One round (the default) is the
run directory itself, exactly as before.

The model is loaded once (`Resources.lm`) and trained in place; every stage of every round
uses that one copy. A killed run resumes where it stopped: finished stages of every round are
skipped by their fingerprints, and a round whose previous adapter changed since it ran (say, a
new dpo setting retrained round 1; `round.json` holds the sha256 of the adapter the round
started from) is removed and run again, with every later round. The eval stage
runs once, after the last round, in DIR itself (the final policy against the base).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from data_gen.fingerprints import file_sha256
from data_gen.pipeline import Resources, run_stages
from wim.config import Config
from wim.errors import InputError
from wim.report import write_rounds_report
from wim.rundir import ROUND_MARKER, RunDir
from wim.stages import STAGES

logger = logging.getLogger(__name__)


def run_rounds(cfg: Config, run: RunDir, stages: tuple[str, ...] | None = None, shard=None,
               progress: bool = True, resources: Resources | None = None) -> dict[str, Any]:
    """`wim run`: one round in `run` itself, or `training.rounds` rounds in `run/rounds/<r>/`,
    then the run's report.json with every round's metrics (`round/<r>/...`). `stages`:
    default every stage (wim/stages.py)."""
    stages = tuple(s.name for s in STAGES) if stages is None else stages
    rounds = cfg.training.rounds
    if cfg.training.mode == "online":
        from training.online import online_run

        return online_run(cfg, run, progress=progress, resources=resources)
    if rounds == 1:
        return run_stages(cfg, run, stages, shard=shard, progress=progress,
                                        resources=resources)
    if shard is not None:
        raise InputError("training.rounds > 1 cannot run as shards (each round trains on all "
                         "of the previous round's pairs); drop --shard.")
    if "train" not in stages:
        raise InputError("--skip-train with training.rounds > 1: a later round needs the "
                         "previous round's adapter; set training.rounds=1 to build pairs only.")
    reports: list[dict[str, Any]] = []
    skipped: list[str] = []
    previous = cfg.policy.adapter
    with contextlib.closing(resources or Resources(cfg)) as res:
        for r in range(1, rounds + 1):
            rdir = run.round(r)
            rcfg = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy,
                                                                       adapter=previous))
            _start_round(run, rdir, r, rounds, previous)
            rdir.claim(rcfg)
            res.start_round(rcfg)
            logger.info("round %d of %d (%s judge%s)", r, rounds, cfg.judge.role,
                        f", policy = base + {previous}" if previous else ", policy = base")
            stats = run_stages(rcfg, rdir, tuple(s for s in stages if s != "eval"),
                               progress=progress, resources=res, close=False)
            rdir.save_config(rcfg)
            skipped += [f"{r}/{s}" for s in stats.get("run/skipped_stages", [])]
            reports.append(stats)
            previous = str(rdir.adapter)  # absolute: RunDir.round resolves
    if "eval" in stages:  # the final policy (last round's adapter) against the base, once
        eval_stats = run_stages(cfg, run, ("eval",), progress=progress)
        skipped += eval_stats["run/skipped_stages"]
    report = write_rounds_report(cfg, run, reports)
    if cfg.wandb.enabled:
        from wim.wandb_log import log_rounds

        log_rounds(cfg, run, report, len(reports))
    report["run/skipped_stages"] = skipped
    return report


def _start_round(run: RunDir, rdir: RunDir, r: int, rounds: int, previous: str | None) -> None:
    """Record which adapter round r starts from; when it changed since the round ran, the
    round and every later one are stale and removed (their samples came from another policy)."""
    sha = file_sha256(Path(previous) / "adapter_model.safetensors") if previous else None
    marker = rdir.file(ROUND_MARKER)
    if marker.is_file():
        if json.loads(marker.read_text()).get("previous_adapter_sha256") == sha:
            return
        logger.warning("round %d started from another adapter than round %d now gives; rounds "
                       "%d-%d run again", r, r - 1, r, rounds)
        for later in range(r, rounds + 1):
            shutil.rmtree(run.round(later).path, ignore_errors=True)
    rdir.ensure_folder()
    marker.write_text(json.dumps({"round": r, "previous_adapter": previous,
                                  "previous_adapter_sha256": sha}, indent=2))
