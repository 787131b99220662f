"""Markdown tables and their cells, built one way for every page (reports, card, summaries)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]] = ()) -> list[str]:
    """The lines of a table: the header, a `|---|` rule as wide as the header, one line per row.
    Cells are written as `str(cell)`: pass free text through `md_cell` first."""
    lines = ["| " + " | ".join(str(cell) for cell in cells) + " |" for cells in (header, *rows)]
    return [lines[0], "|---" * len(header) + "|", *lines[1:]]


def md_cell(text: Any) -> str:
    """Free text (a domain name, a model name) safe inside a markdown table cell: no line
    breaks, `|` escaped, and no raw HTML (`<`, `>`, `&` as entities)."""
    text = " ".join(str(text).split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
