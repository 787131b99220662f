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


NASTY = ["n = 13 < 50", "a <b>bold</b> &amp; &copy; name", "*not emphasis* and _nor this_",
         "snake_case_name stays", "a | b | c", "[a link](http://x) ![img](y)", "back\\slash",
         "`code` and ``more``", "<http://autolink.example>", "5 > 3 & 2 < 4"]


def _rendered_text(markdown: str) -> str:
    """What a reader sees: CommonMark with GFM tables (markdown-it-py), tags dropped."""
    import html
    import re

    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark").enable("table").render(markdown)
    return html.unescape(re.sub(r"<[^>]+>", "", rendered)).strip()


def test_escaped_text_renders_as_itself_in_a_paragraph_and_a_table_cell() -> None:
    from wim.markdown import md_cell

    for text in NASTY:
        assert _rendered_text(f"Note: {md_cell(text)}") == f"Note: {text}", text
        table = "\n".join(markdown_table(["note", "n"], [[md_cell(text), 1]]))
        assert _rendered_text(table).split() == ["note", "n", *text.split(), "1"], text


def test_plain_text_reads_as_itself_in_the_raw_markdown() -> None:
    from wim.markdown import md_cell

    for text in ("n = 13 < 50", "snake_case_name", "A & B", "5 > 3"):
        assert md_cell(text) == text


def test_a_code_span_shows_its_text_verbatim() -> None:
    from wim.markdown import md_code

    for text in NASTY + ["`starts with a backtick", "ends with one`"]:
        assert _rendered_text(f"x {md_code(text)} y") == f"x {text} y", text


def test_one_formatter_for_every_cell() -> None:
    from wim.markdown import MISSING, fmt_value

    assert [fmt_value(v) for v in (None, float("nan"), 0.12345, 7, "a|b")] == \
        [MISSING, MISSING, "0.123", "7", "a\\|b"]
    assert fmt_value(0.4281, pct=True) == "42.8%" and fmt_value(0.5, digits=2) == "0.50"
    assert fmt_value([0.1, None]) == f"[0.100, {MISSING}]"
