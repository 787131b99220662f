"""What a run hands out: the report page (`report:`) and the pairs' dataset card (`card:`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReportConfig:
    browser_prompts: int = 500
    """Prompts shown in report.html's critique browser, at most (failed judgements first, then a
    seeded sample), so that a 100k-prompt page stays a few MB (docs/design.md, "The report")."""


@dataclass
class CardConfig:
    license: str | None = None
    """The `license` of the pairs' dataset card, a Hub license id (`apache-2.0`, `cc-by-4.0`,
    `mit`, `other`, ...). null: the source's own license where its card or dataset info gives
    one, else `unknown`, and the card says so."""
