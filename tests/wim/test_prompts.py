"""Tests for wim.prompts: the bundled set, local file round trips, and error messages."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from wim.prompts import Prompt, PromptsError, bundled_prompts_path, load_prompts

DOMAINS = {
    "science",
    "law",
    "ethics",
    "economics",
    "health",
    "history",
    "technology",
    "everyday_life",
}
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Why is the sea salty?"},
]


def write_jsonl(path: Path, lines: list[object]) -> Path:
    """Write each item as one line: dicts/lists as JSON, strings verbatim."""
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def test_bundled_set_has_8_domains_of_8_with_unique_ids() -> None:
    prompts = load_prompts("bundled")
    assert len(prompts) == 64
    assert Counter(p.domain for p in prompts) == {d: 8 for d in DOMAINS}
    assert len({p.id for p in prompts}) == 64
    assert all(p.id.startswith(p.domain + "-") for p in prompts)
    assert all(p.messages == ({"role": "user", "content": p.text},) for p in prompts)
    assert all(p.text.strip() and len(p.text) < 300 for p in prompts)
    assert bundled_prompts_path().is_file()


def test_limit_keeps_the_first_prompts() -> None:
    everything = load_prompts("bundled")
    assert load_prompts("bundled", limit=5) == everything[:5]
    assert load_prompts("bundled", limit=1000) == everything


@pytest.mark.parametrize("limit", [0, -1])
def test_limit_must_be_positive(limit: int) -> None:
    with pytest.raises(PromptsError, match="positive integer"):
        load_prompts("bundled", limit=limit)


def test_jsonl_round_trip_with_defaults_and_chat_messages(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "a", "domain": "science", "prompt": "Why is the sky blue?"},
            "",  # blank lines are skipped and do not shift the default ids
            {"prompt": CHAT},
            {"id": 7, "prompt": "Count to three."},
        ],
    )
    prompts = load_prompts(str(path))
    assert prompts == [
        Prompt("a", "science", ({"role": "user", "content": "Why is the sky blue?"},)),
        Prompt("00001", "", tuple(CHAT)),
        Prompt("7", "", ({"role": "user", "content": "Count to three."},)),
    ]
    assert prompts[1].text == "Why is the sea salty?"


def test_json_suffix_is_read_as_json_lines(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.json", [{"prompt": "Hi?"}, {"prompt": "Bye?"}])
    assert [p.text for p in load_prompts(str(path))] == ["Hi?", "Bye?"]


def test_csv_round_trip_keeps_ids_as_written(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    pd.DataFrame(
        {"id": ["007", ""], "domain": ["law", ""], "prompt": ["What is a tort?", "Why, though?"]}
    ).to_csv(path, index=False)
    prompts = load_prompts(str(path))
    assert [(p.id, p.domain, p.text) for p in prompts] == [
        ("007", "law", "What is a tort?"),
        ("00001", "", "Why, though?"),
    ]


def test_parquet_round_trip_with_chat_messages(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pd.DataFrame({"prompt": [CHAT, [CHAT[1]]], "domain": ["geo", None]}).to_parquet(path)
    prompts = load_prompts(str(path))
    assert prompts == [
        Prompt("00000", "geo", tuple(CHAT)),
        Prompt("00001", "", (CHAT[1],)),
    ]


def test_missing_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(PromptsError, match="does not exist") as info:
        load_prompts(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_jsonl_has_no_prompts(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(PromptsError, match="contains no prompts") as info:
        load_prompts(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"prompt": "unclosed', "invalid JSON"),
        ('["a list"]', "expected a JSON object, got list"),
        ('{"id": "x"}', "missing 'prompt'"),
        ('{"prompt": 42}', "'prompt' is a int, not a string or a list of messages"),
        ('{"prompt": {"role": "user"}}', "not a string or a list of messages"),
        ('{"prompt": "   "}', "empty prompt"),
        ('{"prompt": []}', "empty prompt"),
        ('{"prompt": [{"role": "user"}]}', "prompt message 1 is not"),
        (
            '{"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]}',
            "expected 'user'",
        ),
        ('{"prompt": "Hi", "id": 1.5}', "'id' must be a string or an integer"),
    ],
)
def test_malformed_jsonl_line_names_file_and_line(
    tmp_path: Path, bad_line: str, expected: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine"}, "", bad_line])
    with pytest.raises(PromptsError) as info:
        load_prompts(str(path))
    message = str(info.value)
    assert str(path) in message
    assert "line 3:" in message  # 1-based, and the blank line 2 still counts
    assert expected in message
    assert "\n" not in message


def test_json_array_file_gets_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "array.json"
    path.write_text(json.dumps([{"prompt": "a"}], indent=1))
    with pytest.raises(PromptsError, match="line 1: invalid JSON.*JSON array"):
        load_prompts(str(path))


def test_duplicate_ids_are_named_with_both_lines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "dup.jsonl",
        [{"id": "q1", "prompt": "a"}, {"id": "q2", "prompt": "b"}, {"id": "q1", "prompt": "c"}],
    )
    with pytest.raises(PromptsError, match="duplicate id 'q1' at line 1 and line 3") as info:
        load_prompts(str(path))
    assert str(path) in str(info.value)


def test_limit_does_not_hide_errors_in_a_local_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"nope": 1}])
    with pytest.raises(PromptsError, match="line 2: missing 'prompt'"):
        load_prompts(str(path), limit=1)


def test_csv_without_prompt_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("id,question\n1,Why?\n")
    with pytest.raises(PromptsError, match="no 'prompt' column .columns: id, question") as info:
        load_prompts(str(path))
    assert str(path) in str(info.value)


def test_parquet_without_prompt_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pd.DataFrame({"text": ["Why?"]}).to_parquet(path)
    with pytest.raises(PromptsError, match="no 'prompt' column") as info:
        load_prompts(str(path))
    assert str(path) in str(info.value)


def test_empty_csv_and_header_only_csv(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(PromptsError, match="is empty"):
        load_prompts(str(empty))
    header_only = tmp_path / "header.csv"
    header_only.write_text("id,prompt\n")
    with pytest.raises(PromptsError, match="contains no prompts"):
        load_prompts(str(header_only))


def test_csv_empty_prompt_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text('prompt\nWhy?\n""\n')
    with pytest.raises(PromptsError, match=r"row 1 \(counting from 0.*empty prompt") as info:
        load_prompts(str(path))
    assert str(path) in str(info.value)


def test_unsupported_existing_file_type(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("Why?\n")
    with pytest.raises(PromptsError, match="unsupported type '.txt'"):
        load_prompts(str(path))


def test_hub_failure_becomes_one_paragraph(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")

    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach the Hub\nsecond line of detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    # Offline mode skips the reachability probe, so the failure comes from `load_dataset` on any
    # machine (CI machines without network failed the probe first).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PromptsError) as info:
        load_prompts("someone/some-prompts", split="test")
    message = str(info.value)
    assert "'someone/some-prompts'" in message and "split 'test'" in message
    assert "ConnectionError: Couldn't reach the Hub." in message
    assert "local .jsonl, .csv or .parquet" in message
    assert "\n" not in message
