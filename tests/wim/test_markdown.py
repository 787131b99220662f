"""The one markdown table builder: header, a rule as wide as the header, cells as str()."""

from __future__ import annotations

from wim.markdown import markdown_table


def test_a_table_is_its_header_a_rule_and_one_line_per_row() -> None:
    rows = [["wim", 10, "0.650"], ("numeric", 9, 0.5)]
    assert markdown_table(["system", "n", "accuracy"], rows) == [
        "| system | n | accuracy |", "|---|---|---|", "| wim | 10 | 0.650 |",
        "| numeric | 9 | 0.5 |"]


def test_a_table_without_rows_keeps_its_header() -> None:
    assert markdown_table(("metric",)) == ["| metric |", "|---|"]
