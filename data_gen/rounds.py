"""`training.rounds`: sample -> judge -> score -> pairs -> train, R times, the judge changing.

Round r is a run directory of its own, `DIR/rounds/<r>/` (the same contract: samples,
judgements, scores, pairs, train/, stats/, report.json), whose config is the run's with
`policy.adapter` set to round r-1's adapter. So in round r the policy samples with that adapter
on, the changing judge judges with it on and the fixed judge with it off; training continues it
(`training.adapter: continue`) or trains a fresh one on the base. One round (the default) is the
run directory itself, exactly as before.

The model is loaded once (`Resources.lm`) and trained in place; every stage of every round
uses that one copy. A killed run resumes where it stopped: finished stages of every round are
skipped by their fingerprints, and a round whose previous adapter changed since it ran (say, a
new dpo setting retrained round 1) is started again, with every later round.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

from data_gen.fingerprints import file_sha256
from data_gen.pipeline import STAGES, Resources, run_stages
from wim.config import Config
from wim.errors import InputError
from wim.rundir import RunDir

logger = logging.getLogger(__name__)

# Metrics copied into the run's report.json per round, as `round/<r>/<key>`.
ROUND_KEYS = ("pairs/count", "pairs/tie_rate/", "pairs/delta/", "pairs/delta_best_worst/",
              "judge/count", "judge/parse_failed", "judge/parse_fail_rate", "judge/model",
              "train/", "tokens/", "time/")


def round_dir(run: RunDir, r: int) -> RunDir:
    return RunDir(run.path.resolve() / "rounds" / str(r))


def adapter_of(run: RunDir) -> str:
    """The adapter folder a round's training writes (absolute, as the next round's config
    names it)."""
    return str(run.path.resolve() / "train" / "adapter")


def round_config(cfg: Config, previous_adapter: str | None) -> Config:
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy,
                                                               adapter=previous_adapter))


def run_rounds(cfg: Config, run: RunDir, stages: tuple[str, ...] = STAGES, shard=None,
               progress: bool = True, resources: Resources | None = None) -> dict[str, Any]:
    """`wim run`: one round in `run` itself, or `training.rounds` rounds in `run/rounds/<r>/`,
    then the run's report.json with every round's metrics (`round/<r>/...`)."""
    rounds = cfg.training.rounds
    if cfg.training.mode == "online":
        from training.online import online_run

        return online_run(cfg, run, progress=progress, resources=resources)
    if rounds == 1:
        return run_stages(cfg, run, stages, shard=shard, progress=progress, resources=resources)
    if shard is not None:
        raise InputError("training.rounds > 1 cannot run as shards (each round trains on all "
                         "of the previous round's pairs); drop --shard.")
    if "train" not in stages:
        raise InputError("--skip-train with training.rounds > 1: a later round needs the "
                         "previous round's adapter; set training.rounds=1 to build pairs only.")
    res = resources or Resources(cfg)
    reports: list[dict[str, Any]] = []
    skipped: list[str] = []
    previous = cfg.policy.adapter
    try:
        for r in range(1, rounds + 1):
            rdir = round_dir(run, r)
            rcfg = round_config(cfg, previous)
            _start_round(run, rdir, r, rounds, previous)
            rdir.claim(rcfg)
            res.start_round(rcfg)
            logger.info("round %d of %d (%s judge%s)", r, rounds, cfg.judge.role,
                        f", policy = base + {previous}" if previous else ", policy = base")
            stats = run_stages(rcfg, rdir, stages, progress=progress, resources=res,
                               close=False)
            rdir.save_config(rcfg)
            skipped += [f"{r}/{s}" for s in stats.get("run/skipped_stages", [])]
            reports.append(stats)
            previous = adapter_of(rdir)
    finally:
        res.close()
    report = write_rounds_report(cfg, run, reports)
    report["run/skipped_stages"] = skipped
    return report


def _start_round(run: RunDir, rdir: RunDir, r: int, rounds: int, previous: str | None) -> None:
    """Record which adapter round r starts from; when it changed since the round ran, the
    round and every later one are stale and removed (their samples came from another policy)."""
    sha = file_sha256(Path(previous) / "adapter_model.safetensors") if previous else None
    marker = rdir.file("round.json")
    if marker.is_file():
        if json.loads(marker.read_text()).get("previous_adapter_sha256") == sha:
            return
        logger.warning("round %d started from another adapter than round %d now gives; rounds "
                       "%d-%d run again", r, r - 1, r, rounds)
        for later in range(r, rounds + 1):
            shutil.rmtree(round_dir(run, later).path, ignore_errors=True)
    rdir.ensure_folder()
    marker.write_text(json.dumps({"round": r, "previous_adapter": previous,
                                  "previous_adapter_sha256": sha}, indent=2))


def per_round_metrics(r: int, report: dict[str, Any]) -> dict[str, Any]:
    return {f"round/{r}/{k}": v for k, v in report.items()
            if k.startswith(ROUND_KEYS) and isinstance(v, (int, float, str))
            and not isinstance(v, bool)}


def write_rounds_report(cfg: Config, run: RunDir, reports: list[dict[str, Any]]
                        ) -> dict[str, Any]:
    """The run's report.json: the last round's report (flat keys, as a one-round run has them)
    plus `training/rounds` and `round/<r>/<metric>` for every round; report.md: a table."""
    report = {k: v for k, v in reports[-1].items() if k != "run/skipped_stages"}
    report["training/rounds"] = len(reports)
    for r, rep in enumerate(reports, start=1):
        report.update(per_round_metrics(r, rep))
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in report.items()}
    run.file("report.json").write_text(json.dumps(clean, indent=2, sort_keys=True))
    run.file("report.md").write_text(render_rounds(cfg, clean, len(reports)))
    if cfg.wandb.enabled:
        from training.wandb_log import log_rounds

        log_rounds(cfg, run, clean, len(reports))
    return clean


def render_rounds(cfg: Config, r: dict[str, Any], rounds: int) -> str:
    rows = [("judge", "judge/model"), ("judged", "judge/count"),
            ("failed to parse", "judge/parse_failed"), ("pairs", "pairs/count"),
            ("tie rate numeric", "pairs/tie_rate/numeric"), ("tie rate WIM", "pairs/tie_rate/wim"),
            ("delta numeric", "pairs/delta/numeric"), ("delta WIM", "pairs/delta/wim"),
            ("DPO loss first", "train/loss_first"), ("DPO loss last", "train/loss_last"),
            ("reward margin (last)", "train/reward_margin_last"),
            ("reward accuracy (last)", "train/reward_accuracy_last"),
            ("tokens generated", "tokens/policy/out"), ("tokens judged", "tokens/judge/out"),
            ("seconds generate", "time/generate"), ("seconds judge", "time/judge"),
            ("seconds train", "time/train"), ("peak RSS MB (train)", "train/peak_rss_mb")]
    lines = ["# WIM run report: rounds", "",
             f"{rounds} rounds, judge role **{cfg.judge.role}** (fixed: the base model, adapter "
             "off; changing: the policy of that round, adapter on), adapter "
             f"`{cfg.training.adapter}`. Each round's full report: `rounds/<r>/report.md`.", ""]
    if cfg.policy.model == "bundled:smollm2-135m-instruct" and cfg.judge.role != "external":
        lines += ["> **Read this first.** The 135M bundled model cannot really judge: these "
                  "numbers are mechanical (every stage ran), not evidence for or against WIM.",
                  ""]
    lines += ["| metric | " + " | ".join(f"round {i}" for i in range(1, rounds + 1)) + " |",
              "|---" * (rounds + 1) + "|"]
    for label, key in rows:
        cells = [_cell(r.get(f"round/{i}/{key}")) for i in range(1, rounds + 1)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value).replace("|", "\\|")
