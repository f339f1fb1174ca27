"""Which tokens' states to compute: the ``positions=`` selection every state trajectory takes.

A state trajectory computes the state after chosen tokens of one kernel call from the call's own
arguments, chunk by chunk. These helpers turn a ``positions=`` argument into the sorted positions to
compute, lay them out by chunk, and bound how much is computed at once, so a few positions of a long
call never hold every state of it.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: How many state elements one block of asked positions computes at once: bounds the temporaries
#: beside the result (about two blocks) when every state of a long call is asked for.
BLOCK_ELEMENTS = 2**26

#: What a ``positions=`` argument may be: one position, a slice, a list, or an index tensor.
Positions = int | slice | list[int] | tuple[int, ...] | Tensor | None


def select_positions(positions: Positions, seq_len: int) -> tuple[Tensor, Tensor | None, bool]:
    """Which positions of a ``seq_len``-token call to compute, and how to hand them back.

    ``positions`` indexes the sequence axis as ``states[:, positions]`` would: an int, a slice,
    a list or tuple, or an integer (or boolean) tensor, negative indices counting from the end.
    Returns the distinct positions in increasing order, the index that maps them to the order
    (and repeats) asked for, ``None`` when they already are in it, and whether one int was asked
    for, which drops the axis.
    """
    if positions is None:
        return torch.arange(seq_len), None, False
    try:
        if isinstance(positions, slice):
            chosen = range(seq_len)[positions]
            wanted = torch.arange(chosen.start, chosen.stop, chosen.step)
        else:
            if isinstance(positions, Tensor):
                positions = positions.cpu()
            wanted = torch.arange(seq_len)[positions]
    except IndexError as error:
        raise IndexError(
            f"positions={positions!r} reaches outside this call's {seq_len} tokens: positions index its sequence "
            f"axis, from 0 to {seq_len - 1}, or from -{seq_len} counting back from the last token"
        ) from error
    single = wanted.dim() == 0
    wanted = wanted.reshape(-1)
    needed, order = torch.unique(wanted, sorted=True, return_inverse=True)
    return needed, None if torch.equal(needed, wanted) else order, single


def chunk_slots(needed: Tensor, chunk_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Lay sorted, distinct positions out by chunk, to compute each chunk's asked states together.

    Returns the chunks holding an asked position ``[chunks]``, the offsets asked in each
    ``[chunks, width]`` (a chunk with fewer than ``width`` repeats its last one), which of those
    slots are real ``[chunks, width]``, and where each chunk's positions start in ``needed``
    ``[chunks + 1]``. Read row by row, the real slots are ``needed`` in order.
    """
    chunks, counts = torch.unique_consecutive(torch.div(needed, chunk_size, rounding_mode="floor"), return_counts=True)
    starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    slot = torch.arange(int(counts.max()))
    taken = starts[:-1, None] + torch.minimum(slot, counts[:, None] - 1)
    return chunks, needed[taken] % chunk_size, slot < counts[:, None], starts


def write_slots(span: Tensor, computed: Tensor, real: Tensor) -> None:
    """Put a block's states, ``[batch, chunks, width, ...]`` with padded slots, into their ``span`` of the result."""
    if bool(real.all()):
        span.unflatten(1, real.shape).copy_(computed)
    else:
        span.copy_(computed[:, real])


def write_states(span: Tensor, real: Tensor, decay: Tensor, starts: Tensor, left: Tensor, right: Tensor) -> None:
    """Put the states of a block of asked slots into their ``span`` of the result: ``decay * starts + left @ right``.

    A chunked scan's state after slot t of a chunk is the chunk's start state
    carried to t (``decay * starts``) plus the chunk's writes up to t, one
    matrix product (``left @ right``). Every operand is laid out
    ``[batch, chunks, width, heads, ...]`` and may broadcast over chunks'
    slots (size 1 on the width axis) or a state axis; ``real`` ``[chunks,
    width]`` marks the slots that are asked positions (``chunk_slots``).

    The states are computed in float32 straight into the result, so the only
    memory beyond it is the operands, unless the result has another dtype or
    a chunk of the block has padded slots: then through a float32 block.
    """
    batch, (count, width) = span.shape[0], real.shape
    rows, columns, inner = *span.shape[-2:], left.shape[-1]
    slots = (count, width, *span.shape[2:-2])
    direct = span.dtype == torch.float32 and bool(real.all())
    result = (
        span.unflatten(1, (count, width))
        if direct
        else span.new_empty((batch, *slots, rows, columns), dtype=torch.float32)
    )
    for row in range(batch):  # one row of a batch is contiguous, so its states can be the product's output
        torch.mul(decay[row], starts[row], out=result[row])
        result[row].view(-1, rows, columns).baddbmm_(
            left[row].expand(*slots, rows, inner).reshape(-1, rows, inner),
            right[row].expand(*slots, inner, columns).reshape(-1, inner, columns),
        )
    if not direct:
        write_slots(span, result, real)
