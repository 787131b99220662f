"""The report stage (`wim report`): report.json, plots, report.md and report.html rebuilt from
the run directory (wim/report/), and logged to wandb when configured."""

from __future__ import annotations

from typing import Any

from data_gen.stages import Shard
from wim.config import Config
from wim.report import write_report
from wim.rundir import RunDir


def run_stage(cfg: Config, run: RunDir, res: Any, shard: Shard | None, progress: bool,
              fingerprint: str) -> dict[str, Any]:
    # `res`: the run's Resources (data_gen/pipeline.py, which imports this module).
    report = write_report(cfg, run)
    if cfg.wandb.enabled and cfg.training.rounds == 1:  # rounds: logged once, training/rounds.py
        from wim.wandb_log import log_run

        # A one-round run: its report is round 1 (metrics, critiques table, resolved config).
        log_run(cfg, [(1, report, run.scores)])
    return report
