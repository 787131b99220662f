"""The stages of a run, in one table: what each is called, which module runs it, what it reads
and writes, and its command.

`STAGES` is the one list, in `wim run`'s order: the command line, the pipeline
(data_gen/pipeline.py), the fingerprints (data_gen/fingerprints.py) and the report read it, so
adding a stage is an entry here and a module with `run_stage` (data_gen/pipeline.py's
`StageRunner`); tests/test_stage_registry.py checks that. A stage's runner is named by its
module, not imported: wim imports neither data_gen nor training (docs/design.md, "Layout").
A name is looked up (`stage_named`) once, where it comes in; the code after that takes the
`Stage`.
"""

from __future__ import annotations

from dataclasses import dataclass

from wim.rundir import (
    ADAPTER_WEIGHTS,
    AGREEMENT,
    DATASET_FOLDER,
    EVAL,
    JUDGEMENTS,
    LOG_HISTORY,
    PAIRS,
    PAIRS_CARD,
    PAIRS_FOLDER,
    REPORT,
    REPORT_HTML,
    REPORT_MD,
    SAMPLES,
    SCORES,
    SPLIT,
    TRAIN_FOLDER,
    stats_name,
)


@dataclass(frozen=True)
class Stage:
    name: str
    module: str
    """The module whose `run_stage` runs it (imported only to run it)."""
    help: str | None
    """Its command's help in `wim --help`; None: no command of its own (`wim eval` has its own
    arguments, wim/cli/evaluation.py)."""
    sections: tuple[str, ...] = ()
    """Config sections (or `section.key`) it reads beyond the run identity: its fingerprint."""
    inputs: tuple[str, ...] = ()
    """Run-directory files it reads (their sha256 is in its fingerprint)."""
    outputs: tuple[str, ...] = ()
    """Run-directory files it writes (a finished stage whose outputs changed runs again)."""
    reads_prompts: bool = False
    """It reads the prompts or generation.source (their sha256 is in its fingerprint)."""
    trains: bool = False
    """It needs a trained adapter: `wim run --skip-train` leaves it out."""
    reads_stats: bool = False
    """It reads every other stage's stats file too (the report)."""

    @property
    def stats_file(self) -> str:
        """Its counts, timings and fingerprint (RunDir.write_stats)."""
        return stats_name(self.name)

# In the order `wim run` runs them.
STAGES: tuple[Stage, ...] = (
    Stage("generate", "data_gen.generate",
          "sample k responses per prompt from the policy (samples.jsonl)",
          outputs=(SAMPLES,), reads_prompts=True),
    Stage("judge", "data_gen.judge",
          "judge each sample: what is missing + a 1-10 rating (judgements.jsonl)",
          inputs=(SAMPLES,), outputs=(JUDGEMENTS,), reads_prompts=True),
    Stage("score", "data_gen.score",
          "(re-)score judgements with scoring.zeta and the embedder; no judge calls",
          sections=("scoring", "judge.on_parse_failure"), inputs=(JUDGEMENTS,),
          outputs=(SCORES,)),
    # The card shows the scoring and judge settings; agreement.json uses validity's zetas.
    Stage("pairs", "data_gen.pairs", "build chosen/rejected pairs (pairs.jsonl, pairs/ dataset)",
          sections=("pairs", "export", "card", "scoring", "judge.on_parse_failure",
                    "eval.compare_zetas"),
          inputs=(SCORES,),
          outputs=(PAIRS, f"{PAIRS_FOLDER}/README.md", PAIRS_CARD, f"{DATASET_FOLDER}/README.md")),
    Stage("train", "training.train", "DPO-train a LoRA adapter on the pairs with TRL (train/)",
          sections=("lora", "dpo", "wandb", "training"), inputs=(PAIRS,),
          outputs=(ADAPTER_WEIGHTS,), trains=True),
    Stage("eval", "training.evaluate", None,
          sections=("eval", "blind", "prompts.holdout", "generation"),
          inputs=(ADAPTER_WEIGHTS, SPLIT), outputs=(EVAL,), trains=True),
    # The report prices the tokens (wim/pricing.py); no other stage reads a price.
    Stage("report", "data_gen.report", "write report.json, report.md, report.html and plots/",
          sections=("scoring", "pairs", "wandb", "report", "http.price", "judge.http.price"),
          inputs=(JUDGEMENTS, SCORES, PAIRS, EVAL, AGREEMENT, f"{TRAIN_FOLDER}/{LOG_HISTORY}"),
          outputs=(REPORT, REPORT_MD, REPORT_HTML), reads_stats=True),
)


def stage_named(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise ValueError(f"unknown stage '{name}': expected one of "
                     f"{', '.join(s.name for s in STAGES)}")


def stage_inputs(stage: Stage) -> tuple[str, ...]:
    """The run-directory files `stage` reads, other stages' stats files included."""
    if not stage.reads_stats:
        return stage.inputs
    return stage.inputs + tuple(s.stats_file for s in STAGES if s is not stage)
