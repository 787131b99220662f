"""The data stages in one run directory: generate -> judge -> score -> pairs (-> report).

`run_stages` runs named stages in order, skipping those unchanged since they finished
(fingerprints.py). The stages are wim/stages.py's table; each stage module has the entry point
`run_stage` (`StageRunner`), imported here by its name in the table when the stage runs, so
that training's stages run through the same loop while this package never imports training.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable
from typing import Any

from data_gen.fingerprints import finished_stats, input_fingerprint, prompts_sha256, record_finished
from data_gen.judge import make_judge
from data_gen.stages import Shard
from wim.backends import Backend, open_backend
from wim.config import Config
from wim.errors import StageIncomplete
from wim.holdout import load_split
from wim.judges import BackendJudge
from wim.models import load_causal_lm
from wim.rundir import REPORT, RunDir
from wim.stages import STAGES, Stage, stage_named

logger = logging.getLogger(__name__)


class Resources:
    """Models a run needs, loaded on first use. One transformers model (`lm`) serves the policy,
    both judge views (fixed: adapter off) and training, in place, over rounds (`start_round`)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._policy: Backend | None = None
        self._judge: BackendJudge | None = None
        self._prompts = None
        self._held_out = None
        self._source = None  # (Source, sha256) of generation.source
        self._lm = None  # (model, tokenizer) of a transformers policy
        self._adapter: str | None = None  # the adapter folder whose weights the model holds

    def prompts(self):
        """The training prompts (`prompts.holdout` held out for `wim eval`), or the source's,
        read into memory (online training only; the data stages stream the source)."""
        if self._prompts is None:
            if self.cfg.generation.source is not None:
                self._prompts = [sp.prompt for sp in self.source()[0]]
                self._held_out = []
            else:
                p = self.cfg.prompts
                self._prompts, self._held_out = load_split(p.source, p.split, p.limit, p.holdout)
        return self._prompts

    def batch_prompts(self):
        """What the judge stage batches: the prompts, or the source's ids and lengths
        (`PromptRef`), from the import's pass over the source or a pass of its own."""
        if self.cfg.generation.source is None:
            return self.prompts()
        source = self.source()[0]
        if not source.complete:
            for _ in source:  # keeps source.refs, not the rows
                pass
        return source.refs

    def check_inputs(self) -> None:
        """Fail on a bad prompts file, or a source that cannot be opened, before the run
        directory is touched (a source's later rows are checked as the import reads them)."""
        if self.cfg.generation.source is not None:
            self.source()[0].check()
        else:
            self.prompts()

    def source(self):
        """(Source, its content sha256) of `generation.source`, streamed at each iteration."""
        if self._source is None:
            from wim.sources import Source, source_sha256

            g = self.cfg.generation
            self._source = (Source(g.source, g.source_split, g.source_shape, g.source_columns,
                                   self.cfg.prompts.limit), source_sha256(g.source, g.source_split))
        return self._source

    def inputs_sha256(self) -> str:
        """What the generate and judge stages read beyond the config: prompts or source."""
        if self.cfg.generation.source is not None:
            return f"source:{self.source()[1]}"
        return prompts_sha256(self.prompts())

    def held_out(self):
        self.prompts()
        return self._held_out

    def lm(self, dtype: str | None = None):
        """(model, tokenizer) of the transformers policy, in `dtype` (default policy.dtype).
        Rounds use a trainable PeftModel so the next round continues the adapter."""
        if self._lm is None:
            c = self.cfg
            self._lm = load_causal_lm(c.policy.model, adapter=c.policy.adapter,
                                      load_in_4bit=c.training.load_in_4bit,
                                      peft_adapter=c.training.rounds > 1,
                                      dtype=dtype or c.policy.dtype)
            self._adapter = c.policy.adapter
        return self._lm

    def start_round(self, cfg: Config) -> None:
        """Switch to a round's config, whose `policy.adapter` (the previous round's) the model
        holds already or gets from disk (a resumed run); the weights are never loaded again."""
        self.cfg, self._policy, self._judge = cfg, None, None
        if self._lm is None or self._adapter == cfg.policy.adapter:
            return
        from peft import PeftModel

        model, tokenizer = self._lm
        if isinstance(model, PeftModel):
            model = model.unload()
        if cfg.policy.adapter:
            model = PeftModel.from_pretrained(model, cfg.policy.adapter, is_trainable=True)
        model.eval()
        self.set_trained((model, tokenizer), cfg.policy.adapter)

    def set_trained(self, lm, adapter: str | None) -> None:
        """The model after training (now carrying `adapter`); backends are rebuilt on it."""
        self._lm, self._adapter = lm, adapter
        self._policy, self._judge = None, None

    def trainable_lm(self, dtype: str | None = None):
        """The shared model for training, or None when training must load its own: an adapter
        attached through the PEFT integration (`policy.adapter` in a one-round run) is not a
        PeftModel TRL can train on, and `wim train` trains a fresh adapter on the base."""
        c = self.cfg
        # vLLM adapter serving: trained here, served there, a local copy that rounds keep.
        served = c.policy.backend == "http" and c.http.adapter_serving == "vllm"
        if not served and (c.policy.backend != "transformers"
                           or (c.policy.adapter and c.training.rounds == 1)):
            return None
        return self.lm(dtype)

    def policy(self) -> Backend:
        if self._policy is None:
            c = self.cfg
            # transformers: the model loaded once here, shared with training and the judge.
            shared = self.lm() if c.policy.backend == "transformers" else None
            self._policy = open_backend(c.policy.backend, c.policy.model, c.http,
                                        batch_size=c.generation.batch_size,
                                        adapter=c.policy.adapter, dtype=c.policy.dtype,
                                        shared=shared)
        return self._policy

    def judge(self) -> BackendJudge:
        if self._judge is None:
            self._judge = make_judge(self.cfg, self.policy)
        return self._judge

    def close(self) -> None:
        for backend in (self._policy, self._judge.backend if self._judge else None):
            if backend is not None:
                backend.close()


# A stage: (cfg, run, resources, shard, progress, fingerprint) -> its stats.
StageRunner = Callable[[Config, RunDir, Resources, "Shard | None", bool, str], dict[str, Any]]


def run_stages(cfg: Config, run: RunDir, stages: tuple[str, ...] | None = None,
               shard: Shard | None = None, progress: bool = True,
               resources: Resources | None = None, close: bool = True) -> dict[str, Any]:
    """Run the named stages (default: every stage of wim/stages.py) in order; returns the merged
    stats (the report when it ran). Names are looked up once, here: an unknown one raises
    ValueError before any stage runs. `close`: release the backends at the end (the rounds keep
    them). Raises StageIncomplete after a stage that lost records to backend failures."""
    steps = STAGES if stages is None else tuple(stage_named(name) for name in stages)
    res = resources or Resources(cfg)
    stats: dict[str, Any] = {}
    skipped = []
    try:
        for stage in steps:
            name = stage.name
            prompts = res.inputs_sha256() if stage.reads_prompts else None
            fingerprint = input_fingerprint(cfg, run, stage, str(shard) if shard else None,
                                            prompts)
            # `wim report DIR` alone always rebuilds: it is cheap, and it is how a report
            # picks up files the fingerprint does not cover (rounds/, plots/ of other tools).
            rebuild = name == "report" and len(steps) == 1
            done = None if rebuild else finished_stats(run, stage, fingerprint)
            if done is not None:
                logger.info("stage %s: config and inputs unchanged since it finished; skipped",
                            name)
                skipped.append(name)
                stats = _report(run) if name == "report" else {**stats, **done}
                continue
            logger.info("stage %s", name)
            out = runner(stage)(cfg, run, res, shard, progress, fingerprint)
            stats = out if name == "report" else {**stats, **out}
            lost = out.get(f"{name}/backend_failed", 0)
            exhausted = out.get(f"{name}/budget_exhausted", 0)
            if lost or exhausted:
                raise StageIncomplete(name, lost, stats, exhausted,
                                      out.get(f"{name}/budget_note", ""))
            record_finished(run, stage, fingerprint)
    finally:
        if close:
            res.close()
    stats["run/skipped_stages"] = skipped
    return stats


def runner(stage: Stage) -> StageRunner:
    """The `run_stage` of the stage's module (wim/stages.py names it)."""
    return importlib.import_module(stage.module).run_stage


def _report(run: RunDir) -> dict[str, Any]:
    return json.loads(run.file(REPORT).read_text())
