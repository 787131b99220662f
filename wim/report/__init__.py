"""The run report as a library: a run directory in, report.json, report.md, report.html and
plots/*.png out.

It reads nothing but the run directory's files and its config, and writes nothing else: the
pipeline's report stage, `wim report DIR`, the rounds and the evaluation commands all call it,
and whoever runs the stage does any logging (wandb).

  build.py     one run: collect the metrics, report.json, report.md (calls the rest)
  rounds.py    a run of several rounds: report.json with `round/<r>/...` keys, report.md table
  sections.py  rounds and blind-evaluation sections, markdown helpers
  plots.py     matplotlib figures (plots/*.png)
  page.py      report.html (self-contained), with browser.py's data and static/
"""

from wim.report.build import (
    SMALL_JUDGE_NOTE,
    SMALL_JUDGES,
    collect_metrics,
    is_small_judge,
    read_evaluation,
    render_markdown,
    write_report,
)
from wim.report.rounds import write_rounds_report

__all__ = ["SMALL_JUDGES", "SMALL_JUDGE_NOTE", "collect_metrics", "is_small_judge",
           "read_evaluation", "render_markdown", "write_report", "write_rounds_report"]
