"""`wim run`: generate -> judge -> score -> pairs -> train -> report, in one run directory.

The one place that decides what runs after what. Each stage can also run alone (`wim generate`,
`wim judge`, ...). The policy model is loaded once and shared: the fixed judge is the same
weights with any adapter disabled. Training and the report live in `training/` and are imported
only when their stage runs.
"""

from __future__ import annotations

import logging
from typing import Any

from data_gen.fingerprints import (
    finished_stats,
    input_fingerprint,
    prompts_sha256,
    record_finished,
)
from data_gen.stages import (
    Shard,
    export_pairs,
    generate_samples,
    judge_samples,
    score_run,
)
from wim.backends import Backend, TransformersBackend, open_backend
from wim.config import Config
from wim.judges import BackendJudge
from wim.prompts import load_prompts
from wim.rundir import RunDir

logger = logging.getLogger(__name__)

STAGES = ("generate", "judge", "score", "pairs", "train", "report")


class StageIncomplete(Exception):
    """A stage lost records to backend failures; the later stages must not build on it."""

    def __init__(self, stage: str, lost: int, stats: dict[str, Any]) -> None:
        what = "samples" if stage == "generate" else "judgements"
        super().__init__(
            f"{lost} {what} were lost to backend failures (server down, timeouts, 5xx; see "
            f"stats/{stage}.json) and were not recorded, so the stages after `{stage}` did not "
            "run. Run the same command again to retry them; finished records are kept."
        )
        self.stage, self.lost, self.stats = stage, lost, stats


class Resources:
    """Models a run needs, loaded on first use and shared between stages."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._policy: Backend | None = None
        self._judge: BackendJudge | None = None
        self._prompts = None

    def prompts(self):
        if self._prompts is None:
            p = self.cfg.prompts
            self._prompts = load_prompts(p.source, split=p.split, limit=p.limit)
        return self._prompts

    def policy(self) -> Backend:
        if self._policy is None:
            c = self.cfg
            self._policy = open_backend(c.policy.backend, c.policy.model, c,
                                        batch_size=c.generation.batch_size,
                                        adapter=c.policy.adapter)
        return self._policy

    def judge(self) -> BackendJudge:
        if self._judge is None:
            self._judge = make_judge(self.cfg, self.policy)
        return self._judge

    def close(self) -> None:
        for backend in (self._policy, self._judge.backend if self._judge else None):
            if backend is not None:
                backend.close()


def make_judge(cfg: Config, policy) -> BackendJudge:
    """The judge for `cfg.judge.role`; `policy` is a callable returning the policy backend."""
    j = cfg.judge
    if j.role == "external":
        backend = open_backend(j.backend, j.model or cfg.http.model, cfg, batch_size=j.batch_size)
        name = j.model or cfg.http.model
    else:
        backend = policy()
        name = cfg.policy.model
        if j.role == "fixed" and isinstance(backend, TransformersBackend):
            backend = backend.reference_view(batch_size=j.batch_size)
        elif cfg.policy.adapter:
            name = f"{name} + adapter {cfg.policy.adapter}"
    return BackendJudge(
        backend, role=j.role, model_name=name, mode=j.mode, prompt=j.prompt, criteria=j.criteria,
        instructions_in=j.instructions_in, max_new_tokens=j.max_new_tokens,
        max_retries=j.max_retries, retry_temperature=j.retry_temperature,
        guided_json=j.guided_json,
    )


def run_stages(cfg: Config, run: RunDir, stages: tuple[str, ...] = STAGES,
               shard: Shard | None = None, progress: bool = True,
               resources: Resources | None = None) -> dict[str, Any]:
    """Run the named stages in order; returns the merged stats (the report when it ran).

    A stage whose config and inputs are unchanged since it last finished is skipped (see
    fingerprints.py). Raises StageIncomplete after a stage that lost records to backend failures.
    """
    res = resources or Resources(cfg)
    stats: dict[str, Any] = {}
    skipped = []
    try:
        for stage in stages:
            if stage not in STAGES:
                raise ValueError(f"unknown stage '{stage}': expected one of {', '.join(STAGES)}")
            prompts = prompts_sha256(res.prompts()) if stage in ("generate", "judge") else None
            fingerprint = input_fingerprint(cfg, run, stage, str(shard) if shard else None,
                                            prompts)
            done = finished_stats(run, stage, fingerprint)
            if done is not None:
                logger.info("stage %s: config and inputs unchanged since it finished; skipped",
                            stage)
                skipped.append(stage)
                stats = _report(run) if stage == "report" else {**stats, **done}
                continue
            logger.info("stage %s", stage)
            out = _run_stage(stage, cfg, run, res, shard, progress, fingerprint)
            stats = out if stage == "report" else {**stats, **out}
            lost = out.get(f"{stage}/backend_failed", 0)
            if lost:
                raise StageIncomplete(stage, lost, stats)
            record_finished(run, stage, fingerprint)
    finally:
        res.close()
    stats["run/skipped_stages"] = skipped
    return stats


def _run_stage(stage: str, cfg: Config, run: RunDir, res: Resources, shard: Shard | None,
               progress: bool, fingerprint: str) -> dict[str, Any]:
    if stage == "generate":
        return generate_samples(cfg, run, res.prompts(), res.policy(), shard, progress)
    if stage == "judge":
        return judge_samples(cfg, run, res.prompts(), res.judge(), shard, progress)
    if stage == "score":
        return score_run(cfg, run)
    if stage == "pairs":
        return export_pairs(cfg, run)
    if stage == "train":
        return train_run(cfg, run, progress, resume_key=fingerprint)
    from training.report import write_report

    return write_report(cfg, run)


def _report(run: RunDir) -> dict[str, Any]:
    import json

    return json.loads(run.file("report.json").read_text())


def train_run(cfg: Config, run: RunDir, progress: bool = True,
              resume_key: str | None = None) -> dict[str, Any]:
    import json
    import time

    from training.dpo import train_dpo

    start = time.perf_counter()
    metrics = train_dpo(cfg, run.pairs, run.file("train"), progress=progress,
                        resume_key=resume_key)
    metrics["time/train"] = time.perf_counter() - start
    (run.file("stats")).mkdir(exist_ok=True)
    (run.file("stats") / "train.json").write_text(json.dumps(metrics, indent=2))
    return metrics
