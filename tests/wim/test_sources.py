"""generation.source loaders (wim/sources.py): the three shapes from every file kind, and the
error messages that name the file, the row and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from wim.config import load_config
from wim.errors import ConfigError, WimError
from wim.sources import Source, SourcedPrompt, source_sha256

ROOT = Path(__file__).resolve().parents[2]


def _read(source: str, **kw) -> tuple[list[SourcedPrompt], Source]:
    """`source` read to its end as the generate stage reads it: (the prompts kept, the reader,
    whose shape, rows and too_few describe the pass)."""
    reader = Source(source, **kw)
    return list(reader), reader


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _uf_rows(n: int = 3) -> list[dict]:
    return [{"instruction": f"Question {i}?",
             "completions": [{"model": m, "response": f"answer {i} by {m}",
                              "overall_score": float(s)}
                             for m, s in (("gpt-4", 9), ("alpaca-7b", 3), ("falcon-40b", 5))]}
            for i in range(n)]


def test_ultrafeedback_parquet_keeps_models_and_ratings(tmp_path: Path) -> None:
    path = tmp_path / "uf.parquet"
    pd.DataFrame(_uf_rows()).to_parquet(path)  # completions become numpy arrays of dicts
    prompts, source = _read(str(path))
    assert source.shape == "ultrafeedback" and source.rows == 3
    first = prompts[0]
    assert first.prompt.text == "Question 0?" and first.prompt.id == "00000"
    assert [r.origin for r in first.responses] == ["gpt-4", "alpaca-7b", "falcon-40b"]
    assert [r.rating for r in first.responses] == [9.0, 3.0, 5.0]
    assert first.responses[1].text == "answer 0 by alpaca-7b"


def test_preference_jsonl_keeps_labels_and_chat_prompts(tmp_path: Path) -> None:
    row = {"prompt": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Capital of Italy?"}],
           "chosen": [{"role": "assistant", "content": "Rome."}],
           "rejected": "Milan.", "id": "q1", "domain": "geo"}
    prompts, source = _read(str(_jsonl(tmp_path / "p.jsonl", [row])))
    [sp] = prompts
    assert source.shape == "preference"
    assert sp.prompt.id == "q1" and sp.prompt.domain == "geo"
    assert sp.prompt.messages[0] == {"role": "system", "content": "Be brief."}
    assert [(r.text, r.label) for r in sp.responses] == [("Rome.", "chosen"),
                                                        ("Milan.", "rejected")]


def test_responses_csv_with_renamed_columns_and_too_few_counted(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    pd.DataFrame({"question": ["A?", "B?", "C?"],
                  "outs": [json.dumps(["a1", "a2"]), json.dumps(["only one"]),
                           json.dumps([{"response": "c1", "model": "m"}, "c2"])]}
                 ).to_csv(path, index=False)
    prompts, source = _read(str(path), shape="responses",
                            columns={"prompt": "question", "responses": "outs"})
    assert [sp.prompt.text for sp in prompts] == ["A?", "C?"]
    assert source.too_few == ["00001"]  # counted, not kept
    assert [r.origin for r in prompts[1].responses] == ["m", ""]


def test_saved_dataset_folder(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_list([{"prompt": "Q?", "responses": ["x", "y"]}]).save_to_disk(
        str(tmp_path / "saved"))
    prompts, source = _read(str(tmp_path / "saved"))
    assert source.shape == "responses"
    assert [r.text for r in prompts[0].responses] == ["x", "y"]


def test_limit_stops_the_reading(tmp_path: Path) -> None:
    # prompts.limit stops reading the source: a bad row after the limit is never reached,
    # and one before it still fails with its line.
    rows = _uf_rows(3) + [{"instruction": "Bad?", "completions": "not a list"}]
    path = _jsonl(tmp_path / "uf.jsonl", rows)
    prompts, source = _read(str(path), limit=2)
    assert len(prompts) == 2 and source.rows == 2
    with pytest.raises(WimError, match=r"line 4: 'completions' is a str, not a list"):
        _read(str(path), limit=4)


def test_parquet_is_read_by_row_groups_and_csv_by_chunks(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wim import rows as source_rows

    rows = _uf_rows(2500)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "uf.parquet", row_group_size=1000)
    prompts, source = _read(str(tmp_path / "uf.parquet"))
    assert source.rows == 2500 and prompts[2499].prompt.text == "Question 2499?"
    # A generator, not a list: the reader hands out rows as they are asked for.
    reader, _ = source_rows.iter_rows(str(tmp_path / "uf.parquet"),
                                      label="Response source", column=None)
    assert next(reader)[0] == "row 0 (counting from 0)" and not isinstance(reader, list)


def test_a_row_without_the_responses_column_is_an_error(tmp_path: Path) -> None:
    rows = [{"prompt": "A?", "responses": ["x", "y"]}, {"prompt": "B?"}]
    with pytest.raises(WimError, match=r"r\.jsonl', line 2: no 'responses' column"):
        _read(str(_jsonl(tmp_path / "r.jsonl", rows)))
    path = tmp_path / "r.parquet"
    pd.DataFrame([{"prompt": "A?", "responses": ["x", "y"]},
                  {"prompt": "B?", "responses": None}]).to_parquet(path)
    with pytest.raises(WimError, match=r"r\.parquet', row 1 \(counting from 0\): an empty "
                                       r"\(null\) 'responses' column"):
        _read(str(path))
    # An empty list is a prompt with too few responses, counted and left out.
    rows = [{"prompt": "A?", "responses": ["x", "y"]}, {"prompt": "B?", "responses": []}]
    assert _read(str(_jsonl(tmp_path / "e.jsonl", rows)))[1].too_few == ["00001"]


def test_a_string_response_that_starts_with_a_bracket_is_a_response(tmp_path: Path) -> None:
    rows = [{"prompt": "List three numbers.", "chosen": "[1, 2, 3]", "rejected": "one two"}]
    [sp], _ = _read(str(_jsonl(tmp_path / "p.jsonl", rows)))
    assert [r.text for r in sp.responses] == ["[1, 2, 3]", "one two"]
    rows = [{"prompt": "Q?", "responses": ["[1, 2, 3]", "[not json"]}]
    path = tmp_path / "r.parquet"
    pd.DataFrame(rows).to_parquet(path)
    [sp], _ = _read(str(path))
    assert [r.text for r in sp.responses] == ["[1, 2, 3]", "[not json"]
    # In a CSV cell a list can only be JSON text, and a chat list is one; "[1, 2, 3]" stays text.
    path = tmp_path / "p.csv"
    pd.DataFrame({"prompt": ["Q?"], "chosen": ["[1, 2, 3]"],
                  "rejected": [json.dumps([{"role": "assistant", "content": "no"}])]}
                 ).to_csv(path, index=False)
    [sp], _ = _read(str(path))
    assert [r.text for r in sp.responses] == ["[1, 2, 3]", "no"]


def test_a_hub_name_offline_fails_within_seconds_and_says_so(tmp_path: Path, monkeypatch
                                                            ) -> None:
    import time

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    start = time.monotonic()
    with pytest.raises(WimError) as err:
        _read("someone/some-dataset")
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert "offline" in message and "127.0.0.1:9" in message
    assert "source source" not in message and message.startswith("Response source")
    with pytest.raises(WimError, match="offline"):
        source_sha256("someone/some-dataset")


@pytest.mark.parametrize(("row", "message"), [
    ({"instruction": "Q?", "completions": [{"model": "m"}]},
     r"uf\.jsonl', line 2, 'completions' entry 1: expected an object with a string 'response'"),
    ({"instruction": "Q?", "completions": [{"model": "m", "response": "r",
                                            "overall_score": "great"}]},
     r"line 2, 'completions' entry 1: 'overall_score' must be a number .* got 'great'"),
    ({"completions": [{"model": "m", "response": "r"}]},
     r"line 2: missing 'instruction'\. Each row needs 'instruction' and 'completions'"),
    ({"instruction": [{"role": "assistant", "content": "hi"}], "completions": []},
     r"line 2: the last prompt message has role 'assistant', expected 'user'"),
])
def test_bad_ultrafeedback_rows_name_file_row_and_expectation(tmp_path: Path, row, message
                                                              ) -> None:
    path = _jsonl(tmp_path / "uf.jsonl", [_uf_rows(1)[0], row])
    with pytest.raises(WimError, match=message):
        _read(str(path))


def test_bad_preference_row_and_unknown_shape(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "Q?", "chosen": "a", "rejected": 3}])
    with pytest.raises(WimError, match=r"p\.jsonl', line 1, 'rejected': expected a string or a "
                                       r"chat list .* got '3'\. Each row needs 'prompt', "
                                       r"'chosen' and 'rejected'"):
        _read(str(path))
    path = _jsonl(tmp_path / "x.jsonl", [{"prompt": "Q?", "answers": ["a", "b"]}])
    with pytest.raises(WimError, match=r"cannot tell its shape from the columns \(prompt, "
                                       r"answers\).*generation.source_shape"):
        _read(str(path))
    assert len(_read(str(path), columns={"responses": "answers"})[0]) == 1


def test_no_prompt_with_two_responses_is_an_error(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "r.jsonl", [{"prompt": "Q?", "responses": ["only"]}])
    with pytest.raises(WimError, match="no prompt has two or more responses"):
        _read(str(path))


def test_missing_file_and_duplicate_ids(tmp_path: Path) -> None:
    with pytest.raises(WimError, match=r"Response source file .*nope\.parquet' does not exist"
                                       r".*generation\.source"):
        _read(str(tmp_path / "nope.parquet"))
    rows = [{"id": "a", "prompt": "Q?", "responses": ["x", "y"]}] * 2
    with pytest.raises(WimError, match=r"duplicate id 'a' at line 1 and line 2"):
        _read(str(_jsonl(tmp_path / "d.jsonl", rows)))


def test_content_hash_follows_the_bytes(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "r.jsonl", [{"prompt": "Q?", "responses": ["x", "y"]}])
    before = source_sha256(str(path))
    assert source_sha256(str(path)) == before
    _jsonl(path, [{"prompt": "Q?", "responses": ["x", "z"]}])
    assert source_sha256(str(path)) != before


def test_config_refuses_a_source_with_prompts_or_rounds() -> None:
    base = ROOT / "configs" / "quickstart.yaml"
    # The quickstart holds out prompts for its blind evaluation; a source has none to hold out.
    cfg = load_config(base, ["generation.source=x.jsonl", "prompts.holdout=0",
                             "generation.source_columns={prompt: question}"])
    assert cfg.generation.source_columns == {"prompt": "question"}
    for extra, key in ((["prompts.source=p.jsonl"], "prompts.source"),
                       (["prompts.holdout=4"], "prompts.holdout"),
                       (["training.rounds=2"], "training.rounds"),
                       (["generation.source_columns={question: q}"], "source_columns"),
                       (["generation.source_shape=table"], "source_shape")):
        with pytest.raises(ConfigError, match=key):
            load_config(base, ["generation.source=x.jsonl", "prompts.holdout=0", *extra])
