"""The sections of what a run hands out: the report page (`report`) and the dataset card of
the pairs (`card`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReportConfig:
    browser_prompts: int = 500
    """Prompts shown in report.html's critique browser, at most: every prompt with a failed
    judgement first, then a seeded sample of the others (the page says "showing N of M"). The
    full data stays in scores.jsonl and pairs.jsonl; a 100k-prompt page stays a few MB."""


@dataclass
class CardConfig:
    license: str | None = None
    """The `license` of the pairs' dataset card, a Hub license id (`apache-2.0`, `cc-by-4.0`,
    `mit`, `other`, ...). null: the source's own license where its card or dataset info gives
    one, else `unknown`, and the card says so."""
