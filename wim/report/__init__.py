"""The run report: a run directory in; report.json, report.md, report.html, plots/*.png out.

It reads nothing but the run directory's files and its config, and writes nothing else: the
pipeline's report stage, `wim report DIR`, the rounds and the evaluation commands all call it,
and whoever runs the stage does any logging (wandb).

  build.py     one run: collect the metrics, report.json, report.md (calls the rest)
  rounds.py    a run of several rounds: report.json with `round/<r>/...` keys, report.md table
  sections.py  rounds and blind-evaluation sections, markdown helpers
  plots.py     matplotlib figures (plots/*.png)
  page.py      report.html (self-contained), with browser.py's data and static/
"""

from wim.report.build import render_markdown, write_report
from wim.report.rounds import write_rounds_report

__all__ = ["render_markdown", "write_report", "write_rounds_report"]
