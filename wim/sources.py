"""Responses that already exist (`generation.source`): read them instead of sampling.

A source is a .jsonl/.json/.csv/.parquet file, a folder saved with `datasets`' `save_to_disk`,
or a `datasets` name (read by wim/rows.py's row reader, so prompts are checked the same way
as `prompts.source`: a string or chat messages ending on a user turn, optional id and domain).
Three shapes (`generation.source_shape`; `auto` picks one by the columns):
- `responses`: a prompt and a list of responses (strings, or objects with a model name and a
  response);
- `ultrafeedback`: a prompt (or UltraFeedback's `instruction`) and `completions`, objects with
  `model`, `response` and optionally a rating (`overall_score`);
- `preference`: prompt, chosen and rejected (strings, or TRL's chat lists); the two sides
  become samples 0 and 1 and keep their label.
Column and key names are configurable (`generation.source_columns`). A bad row raises
`SourceError` naming the file, the row and what was expected; a prompt with fewer than two
responses is counted and left out (it cannot give a pair).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import numbers
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from wim.errors import WimError
from wim.prompts import Prompt, PromptRef, _is_missing, _to_prompt
from wim.rows import hub_offline_reason, iter_rows

logger = logging.getLogger(__name__)

_DEFAULTS = {"prompt": "prompt", "id": "id", "domain": "domain", "responses": "responses",
             "completions": "completions", "model": "model", "response": "response",
             "rating": "overall_score", "chosen": "chosen", "rejected": "rejected"}
LABEL = "Response source"
_FILE_SHA: dict[tuple[str, int, int], str] = {}


class SourceError(WimError):
    """A response source that cannot be read as configured; the message says what to change."""


@dataclass(frozen=True)
class SourcedResponse:
    text: str
    origin: str
    """Who wrote it: the model name where the source gives one, else ""."""
    label: str | None = None
    """`chosen` or `rejected` (preference shape): the source's own preference."""
    rating: float | None = None
    """The source's rating of this response (UltraFeedback's overall_score), if any."""


@dataclass(frozen=True)
class SourcedPrompt:
    prompt: Prompt
    responses: tuple[SourcedResponse, ...]


class Source:
    """A response source as a stream: each iteration reads the rows again and yields the first
    `limit` prompts with two or more responses. A bad row raises `SourceError` (naming file, row
    and column) when it is reached; what a stage wrote before stays written. After a complete
    pass, `shape`, `rows` (rows read), `too_few` (ids of prompts with fewer than two responses)
    and `kept` (prompts yielded) describe it."""

    def __init__(self, source: str, split: str = "train", shape: str = "auto",
                 columns: dict[str, str] | None = None, limit: int | None = None) -> None:
        self.source, self.split, self.limit = source, split, limit
        self.requested_shape, self.columns = shape, dict(columns or {})
        self.shape = shape
        self.rows, self.kept, self.too_few, self.complete = 0, 0, [], False
        self.refs: list[PromptRef] = []
        """The kept prompts' ids and lengths, in source order (complete after a full pass)."""

    def check(self) -> None:
        """Read the first row only, so a bad file or shape fails before anything is written."""
        next(self._prompts(first_only=True), None)

    def __iter__(self) -> Iterator[SourcedPrompt]:
        return self._prompts()

    def _prompts(self, first_only: bool = False) -> Iterator[SourcedPrompt]:
        rows, origin = iter_rows(self.source, self.split, None, label=LABEL, column=None)
        names = {**_DEFAULTS, **self.columns}
        csv = Path(self.source).suffix.lower() == ".csv"
        seen: dict[str, str] = {}
        self.rows, self.kept, self.too_few, self.complete = 0, 0, [], False
        self.refs, shape = [], None
        for index, (where, record) in enumerate(rows):
            here = f"{origin}, {where}"
            if not isinstance(record, dict):
                raise SourceError(f"{here}: expected an object (one prompt with its responses), "
                                  f"got {type(record).__name__}.")
            if shape is None:
                if ("prompt" not in self.columns and "prompt" not in record
                        and "instruction" in record):
                    names["prompt"] = "instruction"  # UltraFeedback's own column name
                shape = self.shape = _pick_shape(self.requested_shape, record, names, origin)
            self.rows += 1
            if _is_missing(record.get(names["prompt"])):
                raise SourceError(f"{here}: missing {names['prompt']!r}. "
                                  f"{_expected(shape, names)}")
            prompt = _to_prompt({"prompt": record[names["prompt"]], "id": record.get(names["id"]),
                                 "domain": record.get(names["domain"])}, index, here)
            if prompt.id in seen:
                raise SourceError(
                    f"{origin}: duplicate id {prompt.id!r} at {seen[prompt.id]} and {where}. Ids "
                    "must be unique because results are keyed by them; rename one or drop the "
                    "id column everywhere to number the prompts by row.")
            seen[prompt.id] = where
            responses = _responses(record, shape, names, here, csv)
            if len(responses) < 2:
                self.too_few.append(prompt.id)
            else:
                self.kept += 1
                self.refs.append(PromptRef(prompt.id, prompt.length))
                yield SourcedPrompt(prompt, responses)
            if first_only or (self.limit is not None and self.kept >= self.limit):
                break
        if first_only:
            return
        if self.rows == 0:
            raise SourceError(f"{origin} holds no rows. Add one row per prompt with its "
                              "responses.")
        if self.too_few:
            logger.warning("%d prompts of %s have fewer than two responses and are skipped",
                           len(self.too_few), self.source)
        if not self.kept:
            raise SourceError(f"{origin}: no prompt has two or more responses, so no pair can "
                              f"be built. {_expected(shape or 'responses', names)}")
        self.complete = True


def _pick_shape(shape: str, first: dict, names: dict[str, str], origin: str) -> str:
    if shape != "auto":
        return shape
    if names["chosen"] in first and names["rejected"] in first:
        return "preference"
    if names["completions"] in first:
        return "ultrafeedback"
    if names["responses"] in first:
        return "responses"
    raise SourceError(
        f"{origin}: cannot tell its shape from the columns ({', '.join(map(str, first))}). "
        f"Expected {names['responses']!r} (a list of responses), {names['completions']!r} "
        f"(UltraFeedback's completions) or {names['chosen']!r} and {names['rejected']!r}; set "
        "generation.source_shape and, where your names differ, generation.source_columns."
    )


def _expected(shape: str, n: dict[str, str]) -> str:
    if shape == "preference":
        return (f"Each row needs {n['prompt']!r}, {n['chosen']!r} and {n['rejected']!r} (strings, "
                "or chat-message lists whose last assistant message is the response).")
    if shape == "ultrafeedback":
        return (f"Each row needs {n['prompt']!r} and {n['completions']!r}: a list of objects "
                f"with {n['model']!r} and {n['response']!r} (and optionally a number "
                f"{n['rating']!r}).")
    return (f"Each row needs {n['prompt']!r} and {n['responses']!r}: a list of strings, or of "
            f"objects with {n['response']!r} and optionally {n['model']!r}.")


def _as_list(value: Any, csv: bool) -> Any:
    """Parquet lists may arrive as numpy arrays; a CSV cell can only hold a list as JSON text.
    Anywhere else a string is a string, whatever it starts with."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if csv and isinstance(value, str) and value.lstrip().startswith("["):
        with contextlib.suppress(ValueError):  # not JSON: the string it is
            return json.loads(value)
    return value


def _side(value: Any, csv: bool) -> Any:
    """A preference side: a string is the response, unless a CSV cell holds a chat list as
    JSON (`"[1, 2, 3]"` stays the string it is)."""
    parsed = _as_list(value, csv)
    if isinstance(value, str) and not (isinstance(parsed, list) and parsed
                                       and all(isinstance(m, dict) and "role" in m
                                               for m in parsed)):
        return value
    return parsed


def _responses(record: dict, shape: str, n: dict[str, str], where: str, csv: bool = False
               ) -> tuple[SourcedResponse, ...]:
    if shape == "preference":
        out = []
        for side in ("chosen", "rejected"):
            if n[side] not in record:
                raise SourceError(f"{where}: no {n[side]!r} column. {_expected(shape, n)}")
            text = _text(_side(record[n[side]], csv), f"{where}, {n[side]!r}", shape, n)
            out.append(SourcedResponse(text, origin="", label=side))
        return tuple(out)
    key = n["completions"] if shape == "ultrafeedback" else n["responses"]
    if key not in record or _is_missing(record[key]):
        what = "no" if key not in record else "an empty (null)"
        raise SourceError(f"{where}: {what} {key!r} column; a row without responses is an "
                          f"error, not a prompt with too few (an empty list is that). "
                          f"{_expected(shape, n)}")
    items = _as_list(record[key], csv)
    if not isinstance(items, list):
        raise SourceError(f"{where}: {key!r} is a {type(items).__name__}, not a list. "
                          f"{_expected(shape, n)}")
    out = []
    for number, item in enumerate(items, start=1):
        at = f"{where}, {key!r} entry {number}"
        if isinstance(item, str) and shape == "responses":
            out.append(SourcedResponse(item, origin=""))
            continue
        if not isinstance(item, dict) or not isinstance(item.get(n["response"]), str):
            raise SourceError(f"{at}: expected an object with a string {n['response']!r}, got "
                              f"{str(item)[:80]!r}. {_expected(shape, n)}")
        model = item.get(n["model"])
        origin = "" if _is_missing(model) else str(model)
        out.append(SourcedResponse(item[n["response"]], origin=origin,
                                   rating=_rating(item.get(n["rating"]), at, n["rating"])))
    return tuple(out)


def _text(value: Any, where: str, shape: str, n: dict[str, str]) -> str:
    """A response: a string, or the last assistant message of a chat list."""
    if isinstance(value, list):
        texts = [m.get("content") for m in value
                 if isinstance(m, dict) and m.get("role") == "assistant"]
        value = texts[-1] if texts else None
    if not isinstance(value, str):
        raise SourceError(f"{where}: expected a string or a chat list with an assistant message, "
                          f"got {str(value)[:80]!r}. {_expected(shape, n)}")
    return value


def _rating(value: Any, where: str, key: str) -> float | None:
    if _is_missing(value) or value == "":
        return None
    if isinstance(value, str) or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
        with contextlib.suppress(ValueError):  # a string that is no number
            return float(value)
    raise SourceError(f"{where}: {key!r} must be a number (the source's rating), got {value!r}; "
                      "fix it, or point generation.source_columns.rating at another key.")


def source_sha256(source: str, split: str = "train") -> str:
    """sha256 of a file's bytes, a saved folder's files (names and bytes), or for a `datasets`
    name, of the commit sha of its Hub repository."""
    path = Path(source).expanduser()
    digest = hashlib.sha256()
    if path.is_file():
        # Every stage's fingerprint asks; a large file is hashed once per change.
        stat = path.stat()
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in _FILE_SHA:
            _add_file(digest, path)
            _FILE_SHA[key] = digest.hexdigest()
        return _FILE_SHA[key]
    elif path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(str(file.relative_to(path)).encode() + b"\0")
            _add_file(digest, file)
    else:
        digest.update(f"{source}:{split}:{_hub_revision(source)}".encode())
    return digest.hexdigest()


def _hub_revision(source: str) -> str:
    """The commit sha of a hub dataset's repository, asked in one call without loading rows."""
    if (offline := hub_offline_reason()) is not None:
        raise SourceError(f"{LABEL} {source!r} is not a file or folder, and the Hugging Face Hub "
                          f"is offline from here: {offline}.")
    try:
        from huggingface_hub import HfApi

        sha = HfApi().dataset_info(source, timeout=10).sha
    except Exception as e:  # the loader raises the clear error when the stage runs
        raise SourceError(f"generation.source {source!r} is not a file or folder, and it "
                          f"could not be found as a Hub dataset ({type(e).__name__}: {e}).") from e
    return str(sha)


def source_license(source: str, split: str = "train") -> str | None:
    """The license a source names for itself, or None: a saved folder's dataset_info.json or
    README.md YAML head, a Hub dataset's card (asked only when the Hub answers); no file's."""
    path = Path(source).expanduser()
    if path.is_file():
        return None
    if path.is_dir():
        for folder in (path, path / split):
            info = folder / "dataset_info.json"
            try:
                found = json.loads(info.read_text()).get("license") if info.is_file() else None
            except (OSError, ValueError, AttributeError):
                found = None
            found = found or _readme_license(folder / "README.md")
            if found:
                return str(found).strip()
        return None
    if hub_offline_reason() is not None:
        return None
    try:
        from huggingface_hub import HfApi

        data = HfApi().dataset_info(source, timeout=10).card_data
        found = data.get("license") if data is not None else None
    except Exception:  # no card, no network: the card then says the license is unknown
        return None
    return _license_name(found)


def _readme_license(readme: Path) -> str | None:
    try:
        text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("---"):
        return None
    head = text.split("---", 2)[1] if text.count("---") >= 2 else ""
    try:
        meta = yaml.safe_load(head) or {}
    except yaml.YAMLError:
        return None
    return _license_name(meta.get("license") if isinstance(meta, dict) else None)


def _license_name(found: Any) -> str | None:
    """A card's `license`: one name, or a list of exactly one."""
    if isinstance(found, list):
        found = found[0] if len(found) == 1 else None
    return str(found) if found else None


def _add_file(digest, path: Path) -> None:
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
