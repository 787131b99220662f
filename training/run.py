"""`wim run` and `wim train`: the data stages, DPO, the blind evaluation and the report, in one
run directory. More: docs/design.md, "Module notes".
"""

from __future__ import annotations

from typing import Any

from data_gen import generate, judge, pairs, report, score
from data_gen.pipeline import Resources, StageRunner, run_stages
from data_gen.stages import Shard
from training import evaluate, train
from wim.config import Config
from wim.rundir import RunDir

STAGES = ("generate", "judge", "score", "pairs", "train", "eval", "report")

RUNNERS: dict[str, StageRunner] = {
    "generate": generate.run_stage, "judge": judge.run_stage, "score": score.run_stage,
    "pairs": pairs.run_stage, "report": report.run_stage, "train": train.run_stage,
    "eval": evaluate.run_stage,
}


def run_stages_with_training(cfg: Config, run: RunDir, stages: tuple[str, ...] = STAGES,
                             shard: Shard | None = None, progress: bool = True,
                             resources: Resources | None = None, close: bool = True
                             ) -> dict[str, Any]:
    """The named stages of `STAGES` in order (see data_gen.pipeline.run_stages)."""
    return run_stages(cfg, run, stages, shard=shard, progress=progress,
                      resources=resources, close=close, runners=RUNNERS)
