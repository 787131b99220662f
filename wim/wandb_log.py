"""Weights & Biases logging of a run (`wandb.enabled`): one wandb run per `wim run`/`wim report`
with the resolved config, every round's metrics (wandb step = round), and a table of the
critiques with their ratings and scores. Training curves come from TRL's own wandb callback."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

from wim.config import Config
from wim.records import iter_keyed
from wim.rundir import REPORT, RunDir

CRITIQUE_COLUMNS = ["round", "prompt_id", "sample_idx", "prompt", "response", "critique",
                    "rating", "parse_ok", "similarity", "score"]
MAX_TABLE_ROWS = 2000  # per round; the full records stay in scores.jsonl


def _numbers(report: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in report.items() if isinstance(v, (int, float))
            and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))}


def log_run(cfg: Config, rounds: list[tuple[int, dict[str, Any], Path]],
            summary: dict[str, Any] | None = None) -> None:
    """`rounds`: (round, its report, its scores.jsonl). Logs them as wandb steps 1..R."""
    import wandb

    rows: list[list[Any]] = []
    # create_new: a run of its own, even when TRL's wandb callback left its run open.
    with wandb.init(project=cfg.wandb.project, config=cfg.to_dict(), job_type="wim-run",
                    reinit="create_new") as wb:
        for r, report, scores in rounds:
            wb.log({"round": r, **_numbers(report)}, step=r)
            if scores.is_file():  # read as a stream: the file may hold 400,000 records
                rows += [[r] + [rec.get(c) for c in CRITIQUE_COLUMNS[1:]]
                         for _, rec in itertools.islice(iter_keyed(scores), MAX_TABLE_ROWS)]
        wb.log({"critiques": wandb.Table(columns=CRITIQUE_COLUMNS, data=rows)})
        for key, value in _numbers(summary or {}).items():
            wb.summary[key] = value


def log_rounds(cfg: Config, run: RunDir, report: dict[str, Any], rounds: int) -> None:
    """A run of `rounds` rounds (DIR/rounds/<r>/report.json)."""
    items = []
    for r in range(1, rounds + 1):
        rdir = run.round(r)
        items.append((r, json.loads(rdir.file(REPORT).read_text()), rdir.scores))
    log_run(cfg, items, summary=report)
