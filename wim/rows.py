"""Rows of a prompt or response source, streamed (`iter_rows`), each with its location ("line
7", "row 12 (counting from 0)") for the reader's errors (wim/prompts.py, wim/sources.py).
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from wim.errors import WimError
from wim.records import one_line, read_input_jsonl

JSONL_SUFFIXES = (".jsonl", ".json")


class PromptsError(WimError):
    """A prompt-source problem, described in one paragraph that says what to change."""


def iter_rows(source: str, split: str = "train", limit: int | None = None,
              label: str = "Prompt", column: str | None = "prompt"
              ) -> tuple[Iterator[tuple[str, Any]], str]:
    """(location, record) pairs of a .jsonl/.json/.csv/.parquet file, a `save_to_disk` folder or
    a `datasets` hub name, and the origin to name in errors ("Prompt file 'x.csv'"). `label`
    says what the rows are for; `column`, when given, must be a column. Rows are read as they
    are consumed (a hub dataset cut to `limit` rows; files by whoever stops reading). A missing
    file raises at once; a bad row raises when it is reached."""
    path = Path(source).expanduser()
    suffix = path.suffix.lower()
    if path.is_dir():
        return _read_saved(path, split, label, column), f"{label} folder {str(path)!r}"
    if path.is_file() or suffix in (*JSONL_SUFFIXES, ".csv", ".parquet"):
        if not path.is_file():
            raise PromptsError(
                f"{label} file {str(path)!r} does not exist. Check the path in "
                f"{_key(label)} (relative paths are resolved from the current directory)"
                + (", or use 'bundled'." if label == "Prompt" else ".")
            )
        if suffix in JSONL_SUFFIXES:  # line by line; blank lines are skipped
            rows = ((f"line {n}", r) for n, r in read_input_jsonl(path, label, PromptsError))
        elif suffix == ".csv":
            rows = _read_csv(path, label, column)
        elif suffix == ".parquet":
            rows = _read_parquet(path, label, column)
        else:
            raise PromptsError(
                f"{label} file {str(path)!r} has an unsupported type {suffix or '(no suffix)'!r}. "
                "Expected .jsonl or .json (one JSON object per line), .csv or .parquet; "
                "convert the file or rename it to match its contents."
            )
        return rows, f"{label} file {str(path)!r}"
    return _read_hub(source, split, limit, label, column), f"Dataset {source!r} (split {split!r})"


def _key(label: str) -> str:
    return "prompts.source" if label == "Prompt" else "generation.source"


def _read_saved(path: Path, split: str, label: str, column: str | None
                ) -> Iterator[tuple[str, Any]]:
    """A folder of `Dataset.save_to_disk` (a DatasetDict: its `split`), memory-mapped."""
    import datasets  # slow to import; only dataset folders need it

    try:
        dataset = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise PromptsError(
            f"{label} folder {str(path)!r} is not a dataset saved with `save_to_disk` "
            f"({one_line(e)}). Point {_key(label)} at a .jsonl, .csv or .parquet file, or at "
            "a folder that `datasets.load_from_disk` reads."
        ) from e
    if isinstance(dataset, datasets.DatasetDict):
        if split not in dataset:
            raise PromptsError(
                f"{label} folder {str(path)!r} holds the splits {', '.join(dataset)}, not "
                f"{split!r}. Set the split to one of them."
            )
        dataset = dataset[split]
    if column is not None and column not in dataset.column_names:
        raise PromptsError(
            f"{label} folder {str(path)!r} has no {column!r} column (columns: "
            f"{', '.join(dataset.column_names)}). Rename the column, or name it in the config."
        )
    return ((f"row {index} (counting from 0)", r) for index, r in enumerate(dataset))


def _missing_column(path: Path, label: str, column: str, columns) -> PromptsError:
    return PromptsError(
        f"{label} file {str(path)!r} has no {column!r} column (columns: "
        f"{', '.join(map(str, columns)) or 'none'}). Rename the column that holds the "
        f"prompts to {column!r}"
        + ("; 'id' and 'domain' columns are optional." if label == "Prompt" else
           ", or name your column in generation.source_columns.")
    )


def _unreadable(path: Path, label: str, column: str | None, e: BaseException) -> PromptsError:
    kind = path.suffix.lower().lstrip(".")
    return PromptsError(
        f"{label} file {str(path)!r} could not be read as {kind} ({one_line(e)}). "
        f"Check that it is a valid {kind} file with a {column or 'prompt'!r} column."
    )


_CHUNK_ROWS = 1000


def _read_csv(path: Path, label: str, column: str | None) -> Iterator[tuple[str, Any]]:
    """A CSV file in chunks of rows, every cell as text (ids like "007" stay as written)."""
    import pandas as pd  # slow to import; only table sources need it

    try:
        chunks = pd.read_csv(path, dtype=str, keep_default_na=False, chunksize=_CHUNK_ROWS)
    except pd.errors.EmptyDataError as e:
        raise PromptsError(
            f"{label} file {str(path)!r} is empty. Add a header with a {column or 'prompt'!r} "
            f"column and one row per prompt, or point {_key(label)} at another file."
        ) from e
    except (OSError, ValueError) as e:
        raise _unreadable(path, label, column, e) from e
    return _csv_rows(chunks, path, label, column)


def _csv_rows(chunks, path: Path, label: str, column: str | None) -> Iterator[tuple[str, Any]]:
    # 0-based like the default ids; CSV line numbers would be wrong for quoted newlines.
    index = 0
    with chunks:
        try:
            for frame in chunks:
                if index == 0 and column is not None and column not in frame.columns:
                    raise _missing_column(path, label, column, frame.columns)
                for record in frame.to_dict("records"):
                    yield f"row {index} (counting from 0, header excluded)", record
                    index += 1
        except (OSError, ValueError) as e:  # raised by the read of the next chunk
            raise PromptsError(
                f"{label} file {str(path)!r}, after row {index - 1} (counting from 0, "
                f"header excluded): not valid CSV ({one_line(e)}). Fix that row."
            ) from e


def _read_parquet(path: Path, label: str, column: str | None) -> Iterator[tuple[str, Any]]:
    """A parquet file row group by row group (pyarrow): lists arrive as lists, nulls as None."""
    import pyarrow.parquet as pq  # slow to import; only parquet sources need it

    try:
        # No pre-buffering, no reader threads: with them pyarrow's pool kept memory for every
        # row read; without, the RSS stays flat.
        table = pq.ParquetFile(path, pre_buffer=False)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise _unreadable(path, label, column, e) from e
    names = table.schema_arrow.names
    if column is not None and column not in names:
        raise _missing_column(path, label, column, names)
    return _parquet_rows(table)


def _parquet_rows(table) -> Iterator[tuple[str, Any]]:
    with table:
        batches = table.iter_batches(batch_size=_CHUNK_ROWS, use_threads=False)
        rows = itertools.chain.from_iterable(batch.to_pylist() for batch in batches)
        yield from ((f"row {index} (counting from 0)", r) for index, r in enumerate(rows))


def hub_offline_reason() -> str | None:
    """Why the Hugging Face Hub cannot be reached, found within seconds (None: reachable, or
    offline mode, where `datasets` reads its cache and fails fast by itself). `datasets`
    would retry a dead network for about 23 seconds before saying so."""
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE"):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        return f"{host}:{port} cannot be reached ({one_line(e)})"
    return None


def _read_hub(source: str, split: str, limit: int | None, label: str, column: str | None
              ) -> Iterator[tuple[str, Any]]:
    """A `datasets` hub dataset, streamed (`streaming=True`): rows come as they are read."""
    hint = ("Without network access, use a local .jsonl, .csv or .parquet file"
            + (" with a 'prompt' column, or 'bundled'." if label == "Prompt" else
               ", or a folder saved with `save_to_disk`."))
    what = label if label.endswith("source") else f"{label} source"  # not "source source"
    if (offline := hub_offline_reason()) is not None:
        raise PromptsError(
            f"{what} {source!r} is not an existing file or folder, and the Hugging Face "
            f"Hub (split {split!r}) is offline from here: {offline}. {hint}"
        )
    try:
        import datasets  # slow to import; only hub sources need it

        dataset = datasets.load_dataset(source, split=split, streaming=True)
    except Exception as e:  # network, auth, unknown name or split: all end the same way
        raise PromptsError(
            f"{what} {source!r} is not an existing file, and it could not be loaded as "
            f"a Hugging Face dataset (split {split!r}): {type(e).__name__}: {one_line(e)}. "
            + hint
        ) from e
    names = dataset.column_names
    if column is not None and names is not None and column not in names:
        raise PromptsError(
            f"Dataset {source!r} (split {split!r}) has no {column!r} column (columns: "
            f"{', '.join(names)}). Choose a dataset with a {column!r} column, or "
            "export the rows to a local .jsonl file."
        )
    if limit is not None:
        dataset = dataset.take(limit)
    return ((f"row {index} (counting from 0)", r) for index, r in enumerate(dataset))
