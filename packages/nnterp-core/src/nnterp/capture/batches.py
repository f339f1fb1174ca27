"""How one batch of sequences runs: a single trace reads every value, and each value becomes rows.

The values are read in invokes of their own over the whole batch, so the order
a user lists them in never meets the order the forward makes them in: values of
the same name on several blocks share an invoke, block by block, which is that
order. Selections and reductions happen inside the trace, on the model's device,
so only what is kept is copied out.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import nnsight
import torch
from torch import Tensor

from .values import HEAD_AXES, TOKEN_AXES, Read, indexer


@dataclass(frozen=True)
class Batch:
    """Sequences of token ids, right-padded, and how many tokens of each are real."""

    input_ids: Tensor
    lengths: Tensor
    #: The global index of each sequence of the batch, counted over the whole capture.
    sequences: Tensor

    @property
    def attention_mask(self) -> Tensor:
        return (torch.arange(self.input_ids.shape[1]) < self.lengths[:, None]).long()

    def picks(self, positions) -> tuple[Tensor, Tensor]:
        """The (sequence in batch, position) of each row ``positions`` picks, counted over each sequence's own tokens.

        A sequence shorter than a position asked for keeps the positions it has.
        """
        rows, places = [], []
        for row, length in enumerate(self.lengths.tolist()):
            chosen = torch.arange(length)[_positions(positions, length)].reshape(-1)
            rows.append(torch.full_like(chosen, row))
            places.append(chosen)
        return torch.cat(rows), torch.cat(places)


def _positions(positions, length: int):
    """``positions`` for a sequence of ``length`` tokens: an int or list beyond it keeps what it reaches."""
    if positions is None:
        return slice(None)
    if isinstance(positions, slice):
        return positions
    wanted = [positions] if isinstance(positions, int) else list(positions)
    return [place for place in wanted if -length <= place < length]


def run(model, reads: list[Read], batch: Batch) -> dict[str, dict[str, Tensor]]:
    """Trace ``batch`` once and return each value's rows: ``{key: {"data", "row" (, "indices")}}``.

    ``row`` holds, for token rows, the (sequence, position) of each row as two
    columns, and for sequence rows the sequence's global index.
    """
    results: dict[str, dict[str, Tensor]] = {}
    groups = defaultdict(list)
    for read in sorted(reads, key=_block_order):
        # One invoke per value and selection: the same value twice in an invoke would be asked for after it passed.
        groups[re.sub(r"\[-?\d+\]", "[]", read.value.key)].append(read)
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    picks = {read.value.key: batch.picks(read.value.positions) for read in reads}
    with torch.no_grad(), model.trace() as tracer:
        with tracer.invoke(inputs):
            pass
        for group in groups.values():
            with tracer.invoke():
                for read in group:
                    results[read.value.key] = nnsight.save(rows(read, picks[read.value.key], batch))
    return results


def _block_order(read: Read) -> tuple[int, ...]:
    """The blocks a read's owner sits in, outermost first: the order the forward reaches the same value on each."""
    return tuple(int(step) for step in getattr(read.owner, "path", "").split(".") if step.isdigit())


def rows(read: Read, picks: tuple[Tensor, Tensor], batch: Batch) -> dict[str, Tensor]:
    """Read ``read``'s value in the trace, and keep its selected rows, reduced and cast, on the CPU."""
    value, dims = read.value, list(read.dims)
    token_axis = next((dims.index(axis) for axis in TOKEN_AXES if axis in dims), None)
    batch_rows, places = picks
    options = {}
    if read.method:
        wanted = torch.unique(places)
        options["positions"] = wanted.tolist()
        if read.attribute == "token_mixing" and value.heads is not None:
            options["heads"] = value.heads
        tensor = getattr(read.owner, read.attribute)(**options)
        places = torch.searchsorted(wanted, places)
    else:
        tensor = getattr(read.owner, read.attribute)
    tensor = tensor.detach()
    if value.heads is not None:
        axis = next(dims.index(axis) for axis in HEAD_AXES if axis in dims)
        if "heads" not in options:
            index = [slice(None)] * tensor.dim()
            index[axis] = indexer(value.heads)
            tensor = tensor[tuple(index)]
        if isinstance(value.heads, int):
            dims.pop(axis)
            token_axis = token_axis - 1 if token_axis is not None and token_axis > axis else token_axis
    kept: dict[str, Tensor] = {}
    if token_axis is None:
        kept["row"] = batch.sequences
    else:
        tensor = tensor.movedim(token_axis, 1)
        if value.positions is None and len(places) == tensor.shape[0] * tensor.shape[1] and not read.method:
            tensor = tensor.flatten(0, 1)  # every token of an unpadded batch, in order: no gather
        else:
            tensor = tensor[batch_rows.to(tensor.device), places.to(tensor.device)]
        if value.reduce == "mean":
            totals = tensor.new_zeros(len(batch.lengths), *tensor.shape[1:]).index_add_(0, batch_rows, tensor)
            counts = torch.bincount(batch_rows, minlength=len(batch.lengths)).clamp(min=1)
            tensor = totals / counts.view(-1, *[1] * (tensor.dim() - 1)).to(tensor)
            kept["row"] = batch.sequences
        else:
            kept["row"] = torch.stack([batch.sequences[batch_rows], picks[1]], dim=1)
    if value.reduce == "norm":
        tensor = tensor.float().norm(dim=-1).to(tensor.dtype)
    elif value.reduce == "topk":
        tensor, kept["indices"] = tensor.topk(value.k, dim=-1)
    if value.dtype is not None:
        tensor = tensor.to(value.dtype)
    kept["data"] = tensor.contiguous()
    return {name: part.cpu() for name, part in kept.items()}
