"""The report of an online DPO run (training/online.py): report.json through the one writer,
and report.md with a row per step."""

from __future__ import annotations

from typing import Any

from wim.config import Config
from wim.markdown import fmt_value, markdown_table
from wim.report.build import write_report_json
from wim.rundir import REPORT_MD, RunDir


def write_online_report(cfg: Config, run: RunDir, report: dict[str, Any],
                        steps: list[dict[str, Any]]) -> dict[str, Any]:
    r = write_report_json(run, report)
    lines = ["# WIM online DPO report", "",
             f"Policy {cfg.policy.model}, judge role {cfg.judge.role}, zeta "
             f"{cfg.scoring.zeta:g}, tie policy `{cfg.training.online_tie_policy}`, failed "
             f"judgements `{cfg.judge.on_parse_failure}`. {r['train/steps']} steps; "
             f"{r['online/pairs']} pairs, {r['online/ties']} ties, {r['online/failed']} failed "
             f"judgements, {r['online/dropped']} pairs kept out of the loss.", ""]
    if cfg.policy.model == "bundled:smollm2-135m-instruct":
        lines += ["> **Read this first.** The 135M bundled model cannot really judge: these "
                  "numbers are mechanical, not evidence for or against WIM.", ""]
    keys = ["pairs", "ties", "failed", "fallback", "dropped", "tie_rate/numeric",
            "tie_rate/wim", "delta/numeric", "delta/wim"]
    lines += markdown_table(["step", *keys],
                            [[s["step"], *(fmt_value(s.get(k)) for k in keys)] for s in steps])
    run.file(REPORT_MD).write_text("\n".join(lines) + "\n")
    return r
