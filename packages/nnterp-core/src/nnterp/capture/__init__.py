"""Activation datasets: standard values of a model over a text corpus, written to disk as sharded safetensors.

::

    from nnterp.capture import Value, capture

    acts = capture(
        "Qwen/Qwen3.5-0.8B",
        ["a text", "another text"],  # or a datasets dataset, ("name", "split"), text files
        ["layers[8].layer_output", Value("layers[4].linear_attn.states", positions=-1)],
        "acts/",
        context=1024,
        batch_size=8,
    )
    for batch in acts.batches("layers[8].layer_output", 4096, seed=0):
        ...  # [4096, hidden_size], shuffled across shards

Every value is read in one trace per batch; each becomes rows (one per token,
or per sequence) that a background thread writes as shards while the next
batches run, so memory holds a few shards whatever the corpus. A killed run
started again with the same arguments goes on from its last complete shard;
:mod:`nnterp.capture.shards` says how, and why the result is then the same,
byte for byte. ``nnterp capture`` is the same from the command line.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

import torch
from tqdm.auto import tqdm

from .batches import Batch, run
from .reader import Activations
from .shards import Store
from .texts import batches, describe, sequences, texts
from .values import CaptureError, Read, Value, plan

__all__ = ["Activations", "CaptureError", "Value", "capture"]

#: How large a shard grows by default, in MiB: it is cut at the first whole batch past it.
SHARD_MIB = 256


def capture(
    model: Any,
    texts_source: Any,
    values: Sequence[str | Value],
    out: str | os.PathLike,
    *,
    context: int = 128,
    batch_size: int = 8,
    pack: bool = True,
    text_column: str = "text",
    split: str = "train",
    max_sequences: int | None = None,
    shard_mib: float = SHARD_MIB,
    progress: bool = True,
    **load: Any,
) -> Activations:
    """Capture ``values`` over ``texts_source`` into the directory ``out``; returns a reader of it.

    Args:
        model: a ``StandardizedTransformer``, or a path or hub id to load as one (with ``load``).
        texts_source: a list of strings, text files (``.txt``, or ``.jsonl`` with ``text_column``),
            a ``datasets`` dataset with ``text_column``, or a dataset's name (``split`` of it, streamed).
        values: standard names (``"layers[8].layer_output"``) or :class:`Value` with a selection.
        out: the directory; a run of the same arguments over an incomplete capture resumes it.
        context: tokens per sequence (at most the model's ``max_position_embeddings``).
        pack: pack the texts into full sequences, BOS first, as SAE trainers do; else one per text.
        max_sequences: stop after this many sequences.
        shard_mib: a shard's size, cut at a whole batch.

    Raises:
        CaptureError: a value, selection, source, context or directory that cannot work, before any batch
            runs; a shard that cannot be written, with what was written and how to go on.
    """
    from ..transformer import StandardizedTransformer

    if not isinstance(model, StandardizedTransformer):
        model = StandardizedTransformer(model, **load)
    reads = plan(model, values)
    _check_context(model, reads, context, batch_size)
    source = texts(texts_source, text_column, split)
    store = Store(
        out,
        _settings(model, reads, texts_source, text_column, split, context, batch_size, pack, max_sequences, shard_mib),
    )
    if store.manifest["complete"]:
        return Activations(out)
    rows = sequences(source, model.tokenizer, context, pack)
    rows = itertools.islice(rows, store.next_sequence, max_sequences)
    pad = model.tokenizer.pad_token_id if model.tokenizer.pad_token_id is not None else 0
    try:
        _run(model, reads, store, batches(rows, batch_size), pad, shard_mib, progress)
    except BaseException:
        store.abandon()
        raise
    store.finish()
    return Activations(out)


def _run(model, reads: list[Read], store: Store, groups, pad: int, shard_mib: float, progress: bool) -> None:
    first = store.next_sequence
    pending: list[tuple[Batch, dict]] = []
    pending_bytes, shard_bytes = 0, shard_mib * 2**20
    with tqdm(desc="capture", unit="tok", unit_scale=True, disable=not progress) as bar:
        for group in groups:
            batch = _batch(group, first, pad)
            first += len(group)
            results = run(model, reads, batch)
            pending.append((batch, results))
            pending_bytes += _size(results)
            bar.update(int(batch.lengths.sum()))
            if pending_bytes >= shard_bytes:
                _flush(store, reads, pending)
                pending, pending_bytes = [], 0
        if pending:
            _flush(store, reads, pending)


def _batch(rows: Sequence[list[int]], first: int, pad: int) -> Batch:
    lengths = torch.tensor([len(row) for row in rows])
    ids = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor(row)
    return Batch(ids, lengths, torch.arange(first, first + len(rows)))


def _size(results: dict[str, dict[str, torch.Tensor]]) -> int:
    return sum(part.nbytes for parts in results.values() for part in parts.values())


def _flush(store: Store, reads: list[Read], pending: list[tuple[Batch, dict]]) -> None:
    """Hand the pending batches to the writer as one shard."""
    tensors: dict[str, torch.Tensor] = {}
    masks = [torch.arange(batch.input_ids.shape[1]) < batch.lengths[:, None] for batch, _ in pending]
    tensors["tokens"] = torch.cat([batch.input_ids[mask] for (batch, _), mask in zip(pending, masks, strict=True)])
    tensors["tokens#sequence"] = torch.cat(
        [batch.sequences[:, None].expand_as(mask)[mask] for (batch, _), mask in zip(pending, masks, strict=True)]
    )
    tensors["tokens#position"] = torch.cat([torch.arange(mask.shape[1]).expand_as(mask)[mask] for mask in masks])
    for read in reads:
        key = read.value.key
        for part, suffix in (("data", ""), ("row", "#row"), ("indices", "#indices")):
            if part in pending[0][1][key]:
                tensors[key + suffix] = torch.cat([results[key][part] for _, results in pending])
    first, last = pending[0][0], pending[-1][0]
    span = (int(first.sequences[0]), int(last.sequences[-1]) + 1)
    store.write(tensors, span, {read.value.key: _describe(read, tensors[read.value.key]) for read in reads})


def _describe(read: Read, data: torch.Tensor) -> dict[str, Any]:
    return {**read.describe(), "dtype": str(data.dtype).removeprefix("torch."), "row_shape": list(data.shape[1:])}


def _settings(model, reads, source, text_column, split, context, batch_size, pack, max_sequences, shard_mib) -> dict:
    """What a resumed run must share with the run it resumes, and what the manifest tells a reader of the data."""
    config = model.config
    return {
        "model": {
            "id": getattr(config, "_name_or_path", None),
            "revision": getattr(config, "_commit_hash", None),
            "model_type": config.model_type,
        },
        "versions": {name: version(name) for name in ("nnterp-core", _plugin(model), "transformers", "torch") if name},
        "values": [read.value.key for read in reads],
        "source": describe(source, text_column, split),
        "context": context,
        "batch_size": batch_size,
        "pack": pack,
        "max_sequences": max_sequences,
        "shard_mib": shard_mib,
    }


def _plugin(model) -> str | None:
    """The distribution of the plugin serving the model's family (the values' code), when it has one."""
    from ..registry import REGISTRY

    plugin = REGISTRY.plugin_of(model.family)
    return plugin.distribution if plugin is not None else None


def _check_context(model, reads: list[Read], context: int, batch_size: int) -> None:
    if context < 1 or batch_size < 1:
        raise CaptureError(f"context={context}, batch_size={batch_size}: both must be at least 1")
    longest = getattr(model.text_config, "max_position_embeddings", None)
    if longest is not None and context > longest:
        raise CaptureError(
            f"context={context} is longer than this model's {longest} positions (max_position_embeddings); "
            f"capture with context={longest} or less"
        )
    for read in reads:
        positions = read.value.positions
        wanted = [positions] if isinstance(positions, int) else positions
        if isinstance(wanted, (list, tuple)) and any(not -context <= place < context for place in wanted):
            raise CaptureError(
                f"{read.value.name}: positions={positions!r} reaches outside a sequence of context={context} tokens "
                f"(0 to {context - 1}, or -{context} to -1 from the end)"
            )
