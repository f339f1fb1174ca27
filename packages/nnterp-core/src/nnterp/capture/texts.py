"""Where a capture's texts come from, and how they become sequences of token ids.

A source is a list of strings, a ``datasets`` dataset (or its name and split)
with a text column, or text files (``.txt``: one text per file; ``.jsonl``: one
record per line). :func:`sequences` tokenizes the texts in order and either
packs them, as SAE trainers expect, or keeps one sequence per text:

- packed: every sequence is ``context`` tokens, starting with the tokenizer's
  BOS, the texts following each other with BOS between them (EOS when the
  tokenizer has no BOS); the last, shorter remainder is dropped;
- unpacked: each text is one sequence, cut at ``context`` tokens.

Both are deterministic, so a resumed capture skips exactly the sequences its
complete shards hold.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .values import CaptureError


def describe(source: Any, text_column: str, split: str) -> dict[str, Any]:
    """What the manifest records of a source, enough for a resumed run to tell it is the same one."""
    if _is_files(source):
        return {"kind": "files", "files": [f"{path}:{path.stat().st_size}" for path in _paths(source)]}
    if isinstance(source, (list, tuple)) and all(isinstance(text, str) for text in source):
        digest = hashlib.sha256("\0".join(source).encode()).hexdigest()
        return {"kind": "texts", "count": len(source), "sha256": digest}
    if isinstance(source, str):
        return {"kind": "dataset", "name": source, "split": split, "column": text_column}
    fingerprint = getattr(source, "_fingerprint", None)
    info = getattr(source, "info", None)
    return {"kind": "dataset", "name": getattr(info, "dataset_name", None), "fingerprint": fingerprint}


def texts(source: Any, text_column: str = "text", split: str = "train") -> Iterator[str]:
    """The source's texts, in order; a missing text column or file fails before the first is returned."""
    if _is_files(source):
        paths = _paths(source)
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            raise CaptureError(f"no text file at {', '.join(missing)}")
        return _file_texts(paths, text_column)
    if isinstance(source, (list, tuple)) and all(isinstance(text, str) for text in source):
        return iter(source)
    if isinstance(source, str):
        source = _load_dataset(source, split)
    columns = getattr(source, "column_names", None)
    if columns is None:
        raise CaptureError(
            f"texts={type(source).__name__}: a capture reads a list of strings, text files, or a datasets dataset"
        )
    if text_column not in columns:
        raise CaptureError(
            f"the dataset has no column {text_column!r}; its columns are {', '.join(columns)}: "
            "pass text_column= naming the one that holds the text"
        )
    return (record[text_column] for record in source)


def _paths(source: Any) -> list[Path]:
    return [Path(path) for path in ([source] if isinstance(source, (str, os.PathLike)) else source)]


def _is_files(source: Any) -> bool:
    """Paths (``pathlib.Path``), or strings naming existing ``.txt`` / ``.jsonl`` files."""
    paths = [source] if isinstance(source, (str, os.PathLike)) else source
    return isinstance(paths, (list, tuple)) and bool(paths) and all(_is_file(path) for path in paths)


def _is_file(path: Any) -> bool:
    return isinstance(path, os.PathLike) or (
        isinstance(path, str) and "\n" not in path and path.endswith((".txt", ".jsonl")) and os.path.isfile(path)
    )


def _file_texts(paths: list[Path], text_column: str) -> Iterator[str]:
    for path in paths:
        if path.suffix != ".jsonl":
            yield path.read_text()
            continue
        with path.open() as lines:
            for number, line in enumerate(lines, 1):
                record = json.loads(line)
                if text_column not in record:
                    raise CaptureError(f"{path}:{number} has no field {text_column!r}; pass text_column=")
                yield record[text_column]


def _load_dataset(name: str, split: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise CaptureError(
            f"texts={name!r} names a dataset, which needs the datasets library: pip install datasets"
        ) from None
    return datasets.load_dataset(name, split=split, streaming=True)


def sequences(texts: Iterable[str], tokenizer: Any, context: int, pack: bool) -> Iterator[list[int]]:
    """The token ids of each sequence, packed to ``context`` tokens or one per text (see the module)."""
    if not pack:
        for text in texts:
            ids = tokenizer(text)["input_ids"][:context]
            if ids:
                yield ids
        return
    separator = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    start = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    room = context - len(start)
    stream: list[int] = []
    for index, text in enumerate(texts):
        if index and separator is not None:
            stream.append(separator)
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        taken = 0
        while len(stream) - taken >= room:
            yield start + stream[taken : taken + room]
            taken += room
        del stream[:taken]


def batches(rows: Iterator[list[int]], size: int) -> Iterator[Sequence[list[int]]]:
    """``rows`` in lists of ``size`` (the last may be shorter)."""
    batch: list[list[int]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
