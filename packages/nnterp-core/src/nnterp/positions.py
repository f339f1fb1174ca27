"""Which tokens' states to compute, and how a chunked recurrence writes them: what every state trajectory shares.

A state trajectory computes the state after chosen tokens of one kernel call from the call's own
arguments, chunk by chunk: a family's chunked algorithm gives the state each chunk starts from,
and within a chunk its recurrence steps token by token. These helpers turn a ``positions=``
argument into the sorted positions to compute (``select_positions``), name the chunks whose start
state is needed (``asked_chunks``), and step those chunks together, writing each asked state
into the result once (``write_chunk_states``), so a few positions of a long call never hold
every state of it. ``nnterp.recurrence.ChunkedRecurrence`` puts them together around a family's math.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

#: How many state elements of running states one block of chunks steps at once (8 MiB in float32): bounds the
#: memory beyond the result, and keeps a block's states in cache from one step to the next.
BLOCK_ELEMENTS = 2**21

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
    return select_indices(positions, seq_len, "positions", f"this call's {seq_len} tokens", "its sequence axis")


def select_indices(
    selection: Positions, count: int, name: str, among: str, axis: str
) -> tuple[Tensor, Tensor | None, bool]:
    """``select_positions`` for any axis of ``count`` entries: the distinct indices picked, sorted, the index back to
    the order asked (``None`` when already in it), and whether one int was asked for.

    ``name``, ``among`` and ``axis`` word the error: ``heads=[9] reaches outside the mixer's 4 heads: heads index its
    heads axis, ...``.
    """
    if selection is None:
        return torch.arange(count), None, False
    try:
        if isinstance(selection, slice):
            chosen = range(count)[selection]
            wanted = torch.arange(chosen.start, chosen.stop, chosen.step)
        else:
            if isinstance(selection, Tensor):
                selection = selection.cpu()
            wanted = torch.arange(count)[selection]
    except IndexError as error:
        raise IndexError(
            f"{name}={selection!r} reaches outside {among}: {name} index {axis}, from 0 to {count - 1}, or from "
            f"-{count} counting back from the last"
        ) from error
    single = wanted.dim() == 0
    wanted = wanted.reshape(-1)
    needed, order = torch.unique(wanted, sorted=True, return_inverse=True)
    return needed, None if torch.equal(needed, wanted) else order, single


def asked_chunks(needed: Tensor, chunk_size: int) -> Tensor:
    """The chunks holding a position of ``needed`` (sorted, distinct), in order: the ones whose start state is needed."""
    return torch.unique_consecutive(torch.div(needed, chunk_size, rounding_mode="floor"))


#: One step of a chunked recurrence: ``advance(running, chunks, step)`` moves the running states of the chunks
#: ``chunks`` (a slice of the asked chunks) in place past their token at offset ``step``.
Advance = Callable[[Tensor, slice, int], None]


def write_chunk_states(states: Tensor, needed: Tensor, chunk_size: int, starts: Tensor, advance: Advance) -> None:
    """Write the state after each of ``needed`` (sorted, distinct) into ``states[:, i]``, stepping every chunk at once.

    ``starts`` ``[batch, chunks, ...]`` (float32) is the state each chunk
    holding a position of ``needed`` starts from, in order (``asked_chunks``;
    the chunked algorithm's boundary states), and ``advance`` the family's
    recurrence, one token of every chunk of a block per call. The chunks of a
    block step together, at most ``chunk_size`` steps whatever the call's
    length, and each asked state is copied into the result once, at its
    position's step: nothing beyond the result and a block of running states
    (``BLOCK_ELEMENTS``) is held.
    """
    needed = needed.cpu()
    offset = needed % chunk_size
    # each position's chunk, counted among the chunks holding one (the order of ``starts``)
    _, chunk = torch.unique_consecutive(torch.div(needed, chunk_size, rounding_mode="floor"), return_inverse=True)
    per_block = max(1, BLOCK_ELEMENTS // starts[:, :1].numel())
    for first in range(0, starts.shape[1], per_block):
        block = slice(first, first + per_block)
        running = starts[:, block].clone()
        in_block = (chunk >= first) & (chunk < first + per_block)
        for step in range(int(offset[in_block].max()) + 1):
            advance(running, block, step)
            here = torch.nonzero(in_block & (offset == step)).squeeze(1)  # where this step's states go in the result
            if len(here):
                # one position per chunk at most: every chunk of the block, in order, or some of them
                source = (
                    running if len(here) == running.shape[1] else running[:, (chunk[here] - first).to(running.device)]
                )
                _copy_to(states, here, source)


def rank_one_steps(decay: Tensor, left: Tensor, right: Tensor) -> Advance:
    """The ``advance`` of ``S_t = decay_t * S_{t-1} + left_t right_t^T``, a decay and a rank-one write per token.

    The gated delta rule and Mamba-2 step so: ``decay`` ``[batch, chunks, chunk, heads, rows or 1, 1]``,
    ``left`` ``[..., rows, 1]`` and ``right`` ``[..., 1, columns]``, each token's, for the asked chunks.
    """

    def advance(running: Tensor, chunks: slice, step: int) -> None:
        running.mul_(decay[:, chunks, step]).addcmul_(left[:, chunks, step], right[:, chunks, step])

    return advance


def _copy_to(states: Tensor, where: Tensor, source: Tensor) -> None:
    """``states[:, where] = source``: a strided copy where ``where`` is evenly spaced (every chunk's slot), else indexed."""
    step = int(where[1] - where[0]) if len(where) > 1 else 1
    if step > 0 and torch.equal(where, where[0] + step * torch.arange(len(where))):
        states[:, int(where[0]) : int(where[-1]) + 1 : step].copy_(source)
    else:
        states.index_copy_(1, where.to(states.device), source.to(states.dtype))
