"""report.html: one self-contained page (no external resource, works offline).

The page is report.md turned into HTML (headings, paragraphs, notes, tables; the plots embedded
as base64 data URIs) followed by the critique browser. report.md is our own restricted markdown
(wim/report/build.py); `markdown_to_html` handles exactly that subset. Every piece of text is
HTML-escaped on the way out whatever escaping the markdown already did (a backslash-escaped
character is that character, an unescaped entity the character it names, then all is escaped
again), so no model or config text can become markup. The browser's data is JSON
inside `<script type="application/json">` with `<`, `>` and `&` as \\u escapes, and the
browser's script (static/report.js) writes model text with `textContent` only.
"""

from __future__ import annotations

import base64
import html
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

from wim.report.browser import script_json

_IMAGE = re.compile(r"^!\[(?P<alt>.*)\]\((?P<src>[^()\s]+)\)$")
# In text outside code spans: a backslash escape (the character itself), an entity, or **bold**.
_INLINE = re.compile(r"\\([!-/:-@\[-`{-~])|(&#?\w+;)|\*\*(.+?)\*\*", re.S)


def _static(name: str) -> str:
    return files("wim.report").joinpath("static", name).read_text(encoding="utf-8")


def _split_unescaped(text: str, sep: str) -> list[str]:
    """Split on `sep` where it is not backslash-escaped."""
    parts = [""]
    for token in re.findall(r"\\.|.", text, re.S):  # an escape pair, or one character
        if token == sep:
            parts.append("")
        else:
            parts[-1] += token
    return parts


def inline(text: str) -> str:
    """One line of our markdown as safe HTML: `code`, **bold**, backslash escapes, entities."""
    out = []
    for n, part in enumerate(_split_unescaped(text, "`")):
        out.append(f"<code>{html.escape(part)}</code>" if n % 2 else _text(part))
    return "".join(out)


def _text(text: str) -> str:
    """Text outside code spans: an escaped character stays that character (`\\&amp;` shows
    "&amp;", `\\*\\*` two stars), an unescaped entity is the character it names."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos:m.start()]))
        escaped, entity, bold = m.groups()
        if bold is not None:
            out.append(f"<strong>{_text(bold)}</strong>")
        else:
            out.append(html.escape(escaped if escaped is not None else html.unescape(entity)))
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


def _table(rows: list[str]) -> str:
    cells = [[c.strip() for c in _split_unescaped(row.strip()[1:-1], "|")] for row in rows]
    head, body = cells[0], [c for c in cells[1:] if not all(set(x) <= {"-", ":"} for x in c)]
    thead = "".join(f"<th>{inline(c)}</th>" for c in head)
    tbody = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>"
                    for row in body)
    return (f"<div class='table-wrap'><table><thead><tr>{thead}</tr></thead>"
            f"<tbody>{tbody}</tbody></table></div>")


def _image(alt: str, src: str, base: Path) -> str:
    path = (base / src).resolve()
    if not path.is_file() or base.resolve() not in path.parents or path.suffix != ".png":
        return f"<p class='missing'>(plot {html.escape(src)} not found)</p>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(alt)}'>"
            f"<figcaption>{inline(alt)}</figcaption></figure>")


def markdown_to_html(markdown: str, base: Path) -> str:
    """report.md's subset: `#`/`##` headings, paragraphs, `>` notes, tables, images."""
    blocks: list[str] = []
    for chunk in re.split(r"\n\s*\n", markdown.strip()):
        lines = chunk.splitlines()
        first = lines[0]
        if first.startswith("## "):
            blocks.append(f"<h2>{inline(first[3:])}</h2>")
        elif first.startswith("# "):
            blocks.append(f"<h1>{inline(first[2:])}</h1>")
        elif first.startswith("|"):
            blocks.append(_table(lines))
        elif first.startswith(">"):
            text = " ".join(line.lstrip(">").strip() for line in lines)
            blocks.append(f"<div class='note warning' role='alert'>{inline(text)}</div>")
        elif len(lines) == 1 and (m := _IMAGE.match(first)):
            blocks.append(_image(m["alt"], m["src"], base))
        else:
            blocks.append(f"<p>{inline(' '.join(lines))}</p>")
    return "\n".join(blocks)


def render_html(markdown: str, base: Path, entries: list[dict[str, Any]],
                small_judge: bool, total_prompts: int) -> str:
    """The whole page: the report, then the critique browser (`entries` of some of the run's
    `total_prompts` prompts)."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>WIM run report</title>
<link rel="icon" href="data:,">
<style>{_static("report.css")}</style>
</head>
<body>
<main>
{markdown_to_html(markdown, base)}
{_browser(entries, small_judge, total_prompts)}
</main>
</body>
</html>
"""


def _browser(entries: list[dict[str, Any]], small_judge: bool, total_prompts: int) -> str:
    """The critique browser: its count, filters, an empty list that report.js fills, its data."""
    warning = ("<div class='note warning banner' role='alert'><strong>Mechanical numbers."
               "</strong> The judge is the bundled 135M model: these ratings and critiques "
               "are close to noise. They show that every stage runs, not that WIM beats "
               "numeric ratings.</div>") if small_judge else ""
    domains = sorted({e["domain"] for e in entries})
    options = "".join(f"<option value='{html.escape(d, quote=True)}'>{html.escape(d or '(none)')}"
                      "</option>" for d in domains)
    counts = {k: sum(e["kind"] == k for e in entries) for k in ("pair", "tie", "unpaired")}
    prompts = len({e["prompt_id"] for e in entries})
    showing = (f"Showing {prompts:,} of {total_prompts:,} prompts"
               + ("." if prompts == total_prompts else
                  ": every prompt with a failed judgement first, then a seeded sample of the "
                  "others (`report.browser_prompts`). Every record is in scores.jsonl and "
                  "pairs.jsonl."))
    return f"""
<section id="browser">
<h2>Critique browser</h2>
{warning}
<p id="browser-showing">{html.escape(showing)}</p>
<p>Each preference pair ({counts['pair']} shown) with its prompt, both responses, both critiques and
all the scores: the judge's rating, then on the 1-10 scale (x * 5 + 5) numeric (the rating),
WIM (the similarity of response and critique), mixed (the zeta mix) and the ranking score the
pairs were built from, plus the prompts that gave no pair: {counts['tie']} whose best and worst
samples tied, {counts['unpaired']} with fewer than two judgements that parsed. Failed
judgements show the judge's raw text.</p>
<div class="filters">
<label>Domain <select id="f-domain"><option value="">all</option>{options}</select></label>
<label>Show <select id="f-kind">
<option value="">everything</option><option value="pair">pairs</option>
<option value="tie">ties</option><option value="failed">parse failures</option>
<option value="clean">no tie, no failure</option></select></label>
<label>Search <input id="f-text" type="search"
placeholder="text in prompt, responses, critiques"></label>
<span id="shown-count" aria-live="polite"></span>
</div>
<div id="entries"></div>
<noscript><p>The critique browser needs JavaScript; the tables above do not.</p></noscript>
</section>
<script type="application/json" id="wim-data">{script_json(entries)}</script>
<script>{_static("report.js")}</script>"""
