"""`wim run` and `wim train`: the data stages (data_gen/pipeline.py), then DPO on the pairs,
then the blind evaluation of the trained policy against its base, then the report, in one run
directory.

The stage order lives here; the loop that runs stages and skips finished ones is
data_gen.pipeline.run_stages, to which this module adds the "train" and "eval" stages. The
eval stage (training/evaluate.py, as `wim eval DIR`) runs when the config holds prompts out
(`prompts.holdout`) and `eval.in_run` is on; it writes eval.json, which the report shows
first. Several rounds and online DPO build on this (training/rounds.py, training/online.py).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from data_gen.pipeline import DATA_RUNNERS, Resources, StageRunner, run_stages
from data_gen.stages import Shard
from wim.backends.adapter_serving import serve_adapter
from wim.config import Config
from wim.rundir import RunDir

logger = logging.getLogger(__name__)

STAGES = ("generate", "judge", "score", "pairs", "train", "eval", "report")


def train_run(cfg: Config, run: RunDir, progress: bool = True,
              resume_key: str | None = None, resources: Resources | None = None
              ) -> dict[str, Any]:
    """DPO on the run's pairs, on the shared model when `resources` holds one (trained in
    place: the next round samples and judges with the new adapter)."""
    from dataclasses import replace

    from training.dpo import train_dpo_model
    from training.placement import process_state

    start = time.perf_counter()
    # The dtype is decided here, where training runs (a directory made on a CPU trains in
    # bfloat16 on a GPU); a policy already in memory in the run's dtype trains under autocast.
    cfg = replace(cfg, policy=replace(cfg.policy, dtype=run.training_dtype(cfg)))
    lm = resources.trainable_lm(cfg.policy.dtype) if resources is not None else None
    metrics, model = train_dpo_model(cfg, run.pairs, run.file("train"), progress=progress,
                                     resume_key=resume_key, lm=lm)
    if lm is not None:
        resources.set_trained((model, lm[1]), str(run.file("train") / "adapter"))
    if (cfg.policy.backend == "http" and cfg.http.adapter_serving == "vllm"
            and process_state().is_main_process):
        # The next round (and `wim eval`) samples by this name on the policy's server.
        metrics["train/served_adapter"] = serve_adapter(cfg.http, run.file("train") / "adapter")
    metrics["time/train"] = time.perf_counter() - start
    if process_state().is_main_process:
        (run.file("stats")).mkdir(exist_ok=True)
        (run.file("stats") / "train.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def _train(cfg: Config, run: RunDir, res: Resources, shard: Shard | None, progress: bool,
           fingerprint: str) -> dict[str, Any]:
    return train_run(cfg, run, progress, resume_key=fingerprint, resources=res)


def eval_enabled(cfg: Config) -> bool:
    return cfg.eval.in_run and cfg.prompts.holdout > 0


def _eval(cfg: Config, run: RunDir, res: Resources, shard: Shard | None, progress: bool,
          fingerprint: str) -> dict[str, Any]:
    """The trained policy against its base on the held-out prompts (eval.json)."""
    from training.evaluate import evaluate_run

    if not eval_enabled(cfg):
        logger.info("stage eval: %s; not run", "eval.in_run is false" if not cfg.eval.in_run
                    else "nothing held out (prompts.holdout is 0)")
        return {}
    start = time.perf_counter()
    report = evaluate_run(cfg, run, progress=progress)
    primary = report["comparisons"][0]
    stats = {"eval/win_rate": primary["win_rate"], "eval/p_value": primary["p_value"],
             "eval/order_agreement": primary["order_agreement"],
             "eval/min_attainable_p_holm": report["min_attainable_p_holm"],
             "time/eval": time.perf_counter() - start}
    run.file("stats").mkdir(exist_ok=True)
    (run.file("stats") / "eval.json").write_text(json.dumps(stats, indent=2))
    return stats


RUNNERS: dict[str, StageRunner] = {**DATA_RUNNERS, "train": _train, "eval": _eval}


def run_stages_with_training(cfg: Config, run: RunDir, stages: tuple[str, ...] = STAGES,
                             shard: Shard | None = None, progress: bool = True,
                             resources: Resources | None = None, close: bool = True
                             ) -> dict[str, Any]:
    """The named stages of `STAGES` in order (see data_gen.pipeline.run_stages)."""
    return run_stages(cfg, run, stages, shard=shard, progress=progress,
                      resources=resources, close=close, runners=RUNNERS)
