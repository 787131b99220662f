"""Judge output parsing: the critique of what is missing and the 1-10 rating.

Tolerant of the text around the fields, strict about their values. The expected output (see
wim/data/judge_prompt.txt) is

    Missing: <what the answer left out, or "None">
    Rating: <one integer from 1 to 10>

Labels may be wrapped in markdown (`**Rating:** 7`, `## Missing -`, `__Rating__ = 7`), carry a
short note in parentheses (`Rating (1-10): 7`), or be JSON keys (`"rating": 7`; a whole JSON
object `{"missing": "...", "rating": 7}`, the guided format of HTTP judges, is decoded first);
the text before, between and after them may be anything. A rating is accepted only when it is
one integer in 1..10, optionally written `7/10` or `7 out of 10`; "0", "11", "7.5", "7.0",
"7,5", "-3", "7-8" and "seven" are failures with a reason (the prompt asks for an integer). A
bare number without a label is never taken as a rating. A failed parse is reported
(`ok=False`, `error`), never filled in; the caller keeps the raw text.

Which label counts: a model that restates the instructions writes "Rating: <one integer ...>"
before its real rating, so the rating is taken from the LAST "Rating" label that is followed by a
number. If that number is invalid, the parse fails; it does not fall back to an earlier one. The
critique is the text after the "Missing" label that opens the last block (after the previous
"Rating" label, preferring a label at the start of a line), up to the chosen "Rating" label.

The authors' format (judge.prompt: authors) is read too: a short explanation, the rating as
`[[N]]`, then what is missing as `[[[...]]]` (`[[[]]]` = nothing). When the text holds a
`[[N]]` rating, that format is used; the last `[[...]]` and the last `[[[...]]]` count.

An echoed rubric is not a critique: a "critique" that restates the rating scale ("10 = nothing
is missing, 7-9 = minor points ...") or copies the instructions fails with the reason
`echoed rubric` (a valid rating is still reported, as for any missing critique).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from wim.judge_prompts import MODES

_Words = TypeVar("_Words", str, list[str])

# Critiques that mean "nothing is missing". Matched after `_normalize_form` (lowercase, single
# spaces, no punctuation at the ends), so "None.", "N/A" and '"Nothing is missing!"' all match.
NOTHING_MISSING = (
    "",
    "none",
    "n/a",
    "nothing",
    "nothing is missing",
    "nothing missing",
    "nothing important",
    "nothing important is missing",
    "nothing important missing",
    "no missing content",
    "the answer is complete",
    "not applicable",
    "no",
    "-",
)

# After the label word: optional markdown or quotes, an optional short note in parentheses, then
# ':', '=' or a dash that does not start a word (so "rating-scale" is no label).
_LABEL_TAIL = (
    r"(?![A-Za-z0-9])[ \t*_`\"']*(?:\([^()\n]{0,30}\)[ \t*_`\"']*)?"
    r"(?:[:=\uff1a]|[-\u2013\u2014](?![A-Za-z]))"
)
_RATING_LABEL = re.compile(r"(?<![A-Za-z0-9])rating" + _LABEL_TAIL, re.IGNORECASE)
_MISSING_LABEL = re.compile(r"(?<![A-Za-z0-9])missing" + _LABEL_TAIL, re.IGNORECASE)
# A "Missing" label at the start of a line, after optional markdown (heading, bullet, bold).
_LINE_MISSING_LABEL = re.compile(r"^[ \t*_#>+`-]*missing" + _LABEL_TAIL, re.I | re.M)
# Labels repeated at the start of a critique ("Missing:" prefill + "**Missing:** ...").
_LEADING_MISSING_LABELS = re.compile(r"^(?:[\s*_#>+`-]*missing" + _LABEL_TAIL + ")+", re.I)
_MARKUP = re.compile(r"[\s*_`\"']*")
_VALUE = re.compile(
    r"(?P<sign>[-+\u2212]?)(?P<int>[0-9]+)(?P<frac>[.,][0-9]+)?"
    r"(?:[ \t]*(?:/|out[ \t]+of)[ \t]*(?P<den>[0-9]+(?:[.,][0-9]+)?))?"
    r"(?:[ \t]*(?:[-\u2013\u2014]|to)[ \t]*(?P<hi>[0-9]+))?",
    re.IGNORECASE,
)
_CODE_FENCE = re.compile(r"```[A-Za-z0-9_+-]*")
_LINE_MARKER = re.compile(r"^[ \t]*(?:#+|>+|[-*+](?=[ \t]))[ \t]*", re.MULTILINE)
# A critique written as a quoted (JSON) string, maybe followed by the comma and the opening quote
# of the next key: '"X", "' -> 'X'.
_QUOTED = re.compile(r"(?s)([\"'])((?:(?!\1).)*)\1[\s,]*[\"']?")


@dataclass(frozen=True)
class ParsedJudgement:
    critique: str | None
    """What is missing; "" when nothing is missing; None in numeric mode or when not found."""
    rating: int | None
    """1..10; None when no valid rating was found. A valid rating is kept when only the
    "Missing" field is absent (ok is False then): check `ok`, not the rating."""
    ok: bool
    """True when every field the mode needs was found and valid."""
    error: str | None
    """Short reason when not ok (several joined by "; "), e.g. "rating 11 outside 1..10"."""


ECHOED_RUBRIC = "echoed rubric"
# One item of a rating scale, as the instructions write it: "10 =", "7-9 =", "1 - 3 =".
_SCALE_ITEM = re.compile(
    r"(?<![\w.])(?:10|[1-9])(?:[ \t]*[-\u2013][ \t]*(?:10|[1-9]))?[ \t]*=[ \t]*\w"
)
_AUTHORS_RATING = re.compile(r"(?<!\[)\[\[(?!\[)([^\[\]\n]{0,20})\]\](?!\])")
_AUTHORS_MISSING = re.compile(r"\[\[\[(.*?)\]\]\]", re.S)


def parse_judgement(text: str, mode: str = "wim", instructions: str = "") -> ParsedJudgement:
    """Parse a judge's full output (prefills included) in `mode` 'wim' or 'numeric'.

    wim mode needs a "Missing" field (or `[[[...]]]`) and a valid rating; numeric mode only the
    rating (critique None). `instructions` (the judge's) recognise a critique that copies them.
    Never raises on any text; raises ValueError only for an unknown `mode`."""
    if mode not in MODES:
        raise ValueError(f"judge mode must be one of {MODES}, got {mode!r}")
    text = _as_text(text)
    if (guided := _from_json(text)) is not None:
        return _parse_json(*guided, mode, instructions)
    if _AUTHORS_RATING.search(text):
        return _parse_authors(text, mode, instructions)
    labels = list(_RATING_LABEL.finditer(text))
    rating, rating_error, chosen = _find_rating(text, labels)
    critique = _find_critique(text, labels, chosen)
    return _judgement(mode, critique, rating, rating_error, "no 'Missing:' field", instructions)


def _from_json(text: str) -> tuple[object, object] | None:
    """(missing, rating) of a guided-format JSON object (wim/judge_prompts.py judge_json_schema)
    with a "rating" key, `missing` None when absent or null; None for any other text."""
    stripped = _CODE_FENCE.sub("", text).strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return None
    try:
        data = json.loads(stripped, strict=False)  # a raw newline inside a string is common
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    fields = {str(k).lower(): v for k, v in data.items()}
    if "rating" not in fields:
        return None
    return fields.get("missing"), fields["rating"]


def _parse_json(missing: object, rating_value: object, mode: str,
                instructions: str) -> ParsedJudgement:
    """A guided judgement's values, each checked alone: "[[3]]" in a critique is no rating."""
    rating, rating_error = _rating_value(_json_value(rating_value))
    critique = None if missing is None else normalize_critique(
        _clean_critique(_json_value(missing)))
    return _judgement(mode, critique, rating, rating_error, "no 'Missing:' field", instructions)


def _json_value(value: object) -> str:
    """One line: a string as it is (newlines as spaces), anything else as JSON."""
    text = value if isinstance(value, str) else json.dumps(value)
    return " ".join(text.split()) or '""'


def _parse_authors(text: str, mode: str, instructions: str) -> ParsedJudgement:
    """`[[N]]` rating and `[[[...]]]` critique; the last of each counts."""
    rating, rating_error = _rating_value(_AUTHORS_RATING.findall(text)[-1].strip())
    blocks = _AUTHORS_MISSING.findall(text)
    critique = normalize_critique(_clean_critique(blocks[-1])) if blocks else None
    return _judgement(mode, critique, rating, rating_error, "no '[[[...]]]' field", instructions)


def _judgement(mode: str, critique: str | None, rating: int | None, rating_error: str | None,
               no_critique: str, instructions: str) -> ParsedJudgement:
    if mode == "numeric":
        return ParsedJudgement(None, rating, rating is not None, rating_error)
    errors = [rating_error] if rating_error else []
    if critique is None:
        errors.append(no_critique)
    elif is_echoed_rubric(critique, instructions):
        critique = None
        errors.append(ECHOED_RUBRIC)
    return ParsedJudgement(critique, rating, not errors, "; ".join(errors) or None)


def is_echoed_rubric(critique: str, instructions: str = "") -> bool:
    """True when a critique restates the rating scale ("10 = nothing is missing, 7-9 = ...")
    or copies the instructions (half or more of its 4-word runs appear in them)."""
    if _SCALE_ITEM.search(critique):
        return True
    words = _normalize_form(critique).split()
    grams = {tuple(words[i : i + 4]) for i in range(len(words) - 3)}
    if not grams or not instructions:
        return False
    source = _normalize_form(re.sub(r"[^\w\s]", " ", instructions)).split()
    known = {tuple(source[i : i + 4]) for i in range(len(source) - 3)}
    plain = {tuple(re.sub(r"[^\w]", "", w) for w in g) for g in grams}
    return len(plain & known) * 2 >= len(plain)


def is_nothing_missing(critique: str) -> bool:
    """True for critiques that say nothing is missing ("", "None.", "N/A", "Nothing is missing")."""
    return _normalize_form(critique) in _NOTHING_FORMS


def normalize_critique(critique: str) -> str:
    """The empty string for the nothing-missing forms, else the critique, stripped."""
    critique = critique.strip()
    return "" if is_nothing_missing(critique) else critique


def _normalize_form(text: str) -> str:
    return _trim(" ".join(text.lower().split()), str.isalnum)


def _trim(items: _Words, keep: Callable[[str], object]) -> _Words:
    """`items` without the ones at either end for which `keep` is false."""
    start, stop = 0, len(items)
    while start < stop and not keep(items[start]):
        start += 1
    while stop > start and not keep(items[stop - 1]):
        stop -= 1
    return items[start:stop]


_NOTHING_FORMS = frozenset(_normalize_form(form) for form in NOTHING_MISSING)


def _as_text(text: object) -> str:
    # Defensive: callers pass str, but a parser that must never raise also takes bytes and None.
    if isinstance(text, str):
        return text
    if isinstance(text, bytes | bytearray):
        return bytes(text).decode("utf-8", errors="replace")
    return "" if text is None else str(text)


def _find_rating(
    text: str, labels: list[re.Match[str]]
) -> tuple[int | None, str | None, re.Match[str] | None]:
    """(rating, error, chosen label): the last label followed by a number, else the last label."""
    if not labels:
        return None, "no rating found", None
    for label in reversed(labels):
        if (value := _VALUE.match(text, _MARKUP.match(text, label.end()).end())) is not None:
            return (*_check_value(value), label)
    label = labels[-1]
    start = _MARKUP.match(text, label.end()).end()
    shown = text[start : start + 80].split("\n", 1)[0].strip().strip("*_`")[:20]
    if not shown:
        return None, "rating label without a value", label
    return None, f"rating {shown!r} is not a number", label


def _rating_value(value: str) -> tuple[int | None, str | None]:
    """(rating, error) of a rating's value on its own (the JSON's, or the authors' [[N]])."""
    match = _VALUE.fullmatch(value)
    return _check_value(match) if match else (None, f"rating {value[:20]!r} is not a number")


def _check_value(value: re.Match[str]) -> tuple[int | None, str | None]:
    shown = value.group(0).strip()[:20]
    if value.group("frac"):
        return None, f"rating {shown} is not an integer"
    if value.group("hi"):
        return None, f"rating {shown} is a range, not one integer"
    if value.group("den") and value.group("den") != "10":
        return None, f"rating {shown} is not on the 1..10 scale"
    digits = value.group("int").lstrip("0") or "0"
    negative = value.group("sign") in ("-", "\u2212")
    # Compare lengths first: int() refuses digit strings over 4300 characters.
    if negative or len(digits) > 2 or not 1 <= int(digits) <= 10:
        return None, f"rating {shown} outside 1..10"
    return int(digits), None


def _find_critique(
    text: str, labels: list[re.Match[str]], chosen: re.Match[str] | None
) -> str | None:
    end = chosen.start() if chosen is not None else len(text)
    # The block of the chosen rating starts after the rating label before it: that skips an
    # echoed "Missing: <...>\nRating: <...>" template.
    begin = max((m.end() for m in labels if m.start() < end), default=0)
    label = _LINE_MISSING_LABEL.search(text, begin, end) or _MISSING_LABEL.search(text, begin, end)
    if label is None:
        label = _last(_LINE_MISSING_LABEL, text, end) or _last(_MISSING_LABEL, text, end)
    if label is None:
        return None
    # The critique ends at the first rating label after it (the chosen one, unless the "Missing"
    # label came from an earlier block).
    stop = next((m.start() for m in labels if m.start() >= label.end()), len(text))
    return normalize_critique(_clean_critique(text[label.end() : stop]))


def _last(pattern: re.Pattern[str], text: str, end: int) -> re.Match[str] | None:
    return max(pattern.finditer(text, 0, end), key=re.Match.start, default=None)


def _clean_critique(raw: str) -> str:
    """Drop markdown and repeated labels, collapse whitespace to single spaces."""
    text = _CODE_FENCE.sub(" ", raw).replace("**", "").replace("`", "")
    text = _LINE_MARKER.sub("", _LEADING_MISSING_LABELS.sub("", text, count=1))
    # Drop words made only of markup at either end ("x __" from "x\n__Rating__: 8"), but keep
    # "__init__"; a word loop, because a regex for this backtracks quadratically.
    text = " ".join(_trim(text.split(), lambda word: word.strip("*_#>"))).strip("*")
    if (quoted := _QUOTED.fullmatch(text)) is not None:
        text = quoted.group(2)
    return text.strip()
