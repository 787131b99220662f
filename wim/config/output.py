"""The sections of what a run hands out: the report page (`report`) and the dataset card of
the pairs (`card`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


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


_LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]*")


def validate_output(cfg: Any, fail) -> None:
    """`report.browser_prompts` and `card.license`; `fail(key, expected, value)` raises."""
    shown = cfg.report.browser_prompts
    if isinstance(shown, bool) or not isinstance(shown, int) or shown < 1:
        fail("report.browser_prompts", "be a positive integer (prompts shown in report.html)",
             shown)
    license_ = cfg.card.license
    if license_ is not None and not (isinstance(license_, str) and _LICENSE.fullmatch(license_)):
        fail("card.license", "be a Hub license id in lower case (e.g. apache-2.0, cc-by-4.0, "
             "mit, other) or null", license_)
