"""The run report: a run directory in; report.json, report.md, report.html, plots/*.png out.
More: docs/design.md, "Module notes".
"""

from wim.report.build import render_markdown, write_report
from wim.report.rounds import write_rounds_report

__all__ = ["render_markdown", "write_report", "write_rounds_report"]
