"""The report of a run of several rounds (`training.rounds` > 1), a table over rounds; each
round's own report is `rounds/<r>/report.md` (build.py).
"""

from __future__ import annotations

from typing import Any

from wim.config import Config
from wim.markdown import fmt_value, markdown_table
from wim.report.build import read_evaluation, write_report_json
from wim.report.evaluation import evaluation_body
from wim.rundir import REPORT_MD, RunDir

# Metrics copied into the run's report.json per round, as `round/<r>/<key>`.
ROUND_KEYS = ("pairs/count", "pairs/tie_rate/", "pairs/delta/", "pairs/delta_best_worst/",
              "judge/count", "judge/parse_failed", "judge/parse_fail_rate", "judge/model",
              "judge/served_model", "train/", "tokens/", "time/")
ROWS = (("judge", "judge/model"), ("judged", "judge/count"),
        ("failed to parse", "judge/parse_failed"), ("pairs", "pairs/count"),
        ("tie rate numeric", "pairs/tie_rate/numeric"), ("tie rate WIM", "pairs/tie_rate/wim"),
        ("delta numeric", "pairs/delta/numeric"), ("delta WIM", "pairs/delta/wim"),
        ("DPO loss first", "train/loss_first"), ("DPO loss last", "train/loss_last"),
        ("reward margin (last)", "train/reward_margin_last"),
        ("reward accuracy (last)", "train/reward_accuracy_last"),
        ("tokens generated", "tokens/policy/out"), ("tokens judged", "tokens/judge/out"),
        ("seconds generate", "time/generate"), ("seconds judge", "time/judge"),
        ("seconds train", "time/train"), ("peak RSS MB (train)", "train/peak_rss_mb"))


def write_rounds_report(cfg: Config, run: RunDir, reports: list[dict[str, Any]]
                        ) -> dict[str, Any]:
    """The run's report.json: the last round's report (flat keys, as a one-round run has them)
    plus `training/rounds` and `round/<r>/<metric>` for every round; report.md: a table."""
    report = {k: v for k, v in reports[-1].items() if k != "run/skipped_stages"}
    report["training/rounds"] = len(reports)
    for r, rep in enumerate(reports, start=1):
        report.update({f"round/{r}/{k}": v for k, v in rep.items()
                       if k.startswith(ROUND_KEYS) and isinstance(v, (int, float, str))
                       and not isinstance(v, bool)})
    clean = write_report_json(run, report)
    lines = ["# WIM run report: rounds", "",
             f"{len(reports)} rounds, judge role **{cfg.judge.role}** (fixed: the base model, "
             "adapter off; changing: the policy of that round, adapter on), adapter "
             f"`{cfg.training.adapter}`. Each round's full report: `rounds/<r>/report.md`.", ""]
    if cfg.policy.model == "bundled:smollm2-135m-instruct" and cfg.judge.role != "external":
        lines += ["> **Read this first.** The 135M bundled model cannot really judge: these "
                  "numbers are mechanical (every stage ran), not evidence for or against WIM.",
                  ""]
    evaluation = read_evaluation(run)
    if evaluation:
        lines += ["## Blind evaluation: the final policy against its base (eval.json)", "",
                  *evaluation_body(evaluation), "## Per round", ""]
    numbers = range(1, len(reports) + 1)
    lines += markdown_table(["metric", *(f"round {i}" for i in numbers)], [
        [label, *(fmt_value(clean.get(f"round/{i}/{key}")) for i in numbers)]
        for label, key in ROWS])
    run.file(REPORT_MD).write_text("\n".join(lines) + "\n")
    return clean
