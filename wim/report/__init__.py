"""The run report as a library: a run directory in, report.json, report.md, report.html and
plots/*.png out.
More: docs/design.md, "Module notes".
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
