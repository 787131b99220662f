"""Markdown tables and their cells, built one way for every page (reports, card, summaries)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

MISSING = "-"


def fmt_value(value: Any, pct: bool = False, digits: int = 3) -> str:
    """The one cell formatter of every table and sentence: `MISSING` for None or NaN; a float to
    `digits` decimals, or as a percent with one (`pct`); a list or tuple as `[low, high]`,
    each value formatted alike; an int as itself; anything else (a name) through `md_cell`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt_value(v, pct, digits) for v in value) + "]"
    if isinstance(value, float):
        return f"{100 * value:.1f}%" if pct else f"{value:.{digits}f}"
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else md_cell(value)


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]] = ()) -> list[str]:
    """The lines of a table: the header, a `|---|` rule as wide as the header, one line per row.
    Cells are written as `str(cell)`: pass free text through `md_cell` first."""
    lines = ["| " + " | ".join(str(cell) for cell in cells) + " |" for cells in (header, *rows)]
    return [lines[0], "|---" * len(header) + "|", *lines[1:]]


# What Markdown would read as syntax in running text or a table cell, escaped with a backslash
# (CommonMark allows it before any ASCII punctuation): `\`, a backtick, `*`, brackets and `|`
# always; `<` and `&` only where they would open an HTML tag or an entity; `_` only at a word's
# edge (inside a word it makes no emphasis). So the raw .md reads as the text: "n = 13 < 50",
# where HTML entities ("&lt;") showed in a terminal.
_MARKDOWN_SYNTAX = re.compile(r"[\\`*\[\]|]|<(?=[A-Za-z/!?])|&(?=[A-Za-z#])"
                              r"|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def md_cell(text: Any) -> str:
    """Free text (a domain name, a model name, a note) safe in a Markdown table cell or a
    paragraph: one line, with `_MARKDOWN_SYNTAX` escaped, so no raw HTML, no emphasis, no link,
    and no `|` that ends a cell. Not for code spans, where escapes are literal: see `md_code`."""
    return _MARKDOWN_SYNTAX.sub(lambda m: "\\" + m.group(), " ".join(str(text).split()))


def md_code(text: Any) -> str:
    """Free text as an inline code span, outside tables: backslashes and entities are literal
    in a code span, so nothing is escaped; the fence is one backtick longer than the longest
    run of backticks inside, and padded with a space when the text starts or ends with one."""
    text = " ".join(str(text).split())
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
