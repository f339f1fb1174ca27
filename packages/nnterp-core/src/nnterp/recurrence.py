"""A linear recurrence computed chunk by chunk: the mechanism of every state trajectory, its math left to the family.

A state trajectory computes the state after chosen tokens of one kernel call from the call's own
arguments. Every family does it the same way, and ``ChunkedRecurrence`` holds that way: it lays the
tokens up to the last asked one out in chunks, carries the state across them in a loop over
chunks (not tokens), keeps the state each chunk holding an asked position starts from, and steps
those chunks together token by token (``nnterp.positions.write_chunk_states``). A family's
subclass supplies its math only: how its tokens lie in chunks, how a chunk carries its start state
to its end, and one token's step. ``state_patch_estimates`` pairs two runs' states, a chunk at a
time (``ChunkedRecurrence.chunks_backwards``), with an adjoint run backwards beside them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from .positions import Advance, Positions, asked_chunks, select_positions, write_chunk_states


class ChunkedRecurrence:
    """One kernel call's recurrence, chunk by chunk: the states after the tokens ``positions`` selects.

    A family's subclass holds the call's arguments and supplies its math:

    - ``lay_out(end)``: its tokens before ``end`` laid out in chunks of ``chunk_size`` (``in_chunks``),
      and what the carry needs of every chunk, computed for all of them at once;
    - ``carry(start, chunk, writes)``: the state a chunk ends in, from the one it starts in;
      ``writes(start, chunk)`` first, where what a chunk's tokens write depends on the state it
      starts from (the delta rule's corrections; by default it does not);
    - ``steps(asked, writes)``: the ``Advance`` that steps the chunks holding asked positions,
      one token of each per call.

    ``states`` does the rest, the same for every family. States are ``shape``
    ``[batch, ...]``, computed in float32 from ``initial_state`` (in that layout; ``None`` for
    zeros) and returned in ``dtype`` on ``device``.
    """

    def __init__(
        self,
        seq_len: int,
        shape: tuple[int, ...],
        initial_state: Tensor | None,
        chunk_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.seq_len = seq_len
        self.shape = shape
        self.initial_state = initial_state
        self.chunk_size = chunk_size
        self.dtype = dtype
        self.device = device

    def states(self, positions: Positions) -> Tensor:
        """The state after each token ``positions`` selects, ``[batch, positions, ...]``, only those computed.

        ``positions`` selects as ``states[:, positions]`` would (``select_positions``; an int drops
        the axis). The loop over chunks stops at the last one asked for and holds one state per
        chunk holding an asked position.
        """
        needed, order, single = select_positions(positions, self.seq_len)
        batch, *state = self.shape
        states = torch.empty(batch, len(needed), *state, dtype=self.dtype, device=self.device)
        if len(needed):
            self._write_states(states, needed)
        if order is not None:
            states = states[:, order]
        return states[:, 0] if single else states

    def _write_states(self, states: Tensor, needed: Tensor) -> None:
        """Write the state after each of ``needed`` (sorted, distinct) into ``states[:, i]``."""
        end = int(needed[-1]) + 1  # later tokens cannot change an earlier state
        asked = asked_chunks(needed, self.chunk_size)
        starts, advance = self._start_states(end, asked)
        write_chunk_states(states, needed, self.chunk_size, starts, advance)

    def chunks_backwards(self) -> Iterator[tuple[int, Tensor]]:
        """Each chunk's first position and the states after its tokens, ``[batch, tokens, ...]`` float32, last chunk first.

        For a product with something that runs backwards through the call (a
        recurrence's adjoint) without holding a state per token of the call:
        one chunk's states at a time, in one buffer that the next chunk writes
        over (and the caller may). The loop over chunks runs once.
        """
        chunks = -(-self.seq_len // self.chunk_size)
        starts, advance = self._start_states(self.seq_len, torch.arange(chunks))
        batch, *state = self.shape
        buffer = torch.empty(batch, self.chunk_size, *state, device=self.device)
        for chunk in reversed(range(chunks)):
            first = chunk * self.chunk_size
            tokens = min(self.chunk_size, self.seq_len - first)
            running = starts[:, chunk : chunk + 1].clone()
            for step in range(tokens):
                advance(running, slice(chunk, chunk + 1), step)
                buffer[:, step] = running[:, 0]
            yield first, buffer[:, :tokens]

    def chunk_starts(self) -> tuple[Tensor, list[Tensor | None]]:
        """The state each chunk of the call starts from, ``[batch, chunks, ...]`` float32, and each chunk's ``writes``.

        For a product a family takes over whole chunks, stepping no token
        (the delta rule's state patch estimate): the loop over chunks, laid
        out first.
        """
        return self._carried(self.seq_len, torch.arange(-(-self.seq_len // self.chunk_size)))

    def _start_states(self, end: int, asked: Tensor) -> tuple[Tensor, Advance]:
        """The state each chunk of ``asked`` (sorted, distinct) starts from, ``[batch, asked, ...]`` float32, and the
        ``Advance`` stepping those chunks."""
        starts, asked_writes = self._carried(end, asked)
        return starts, self.steps(asked.to(self.device), asked_writes)

    def _carried(self, end: int, asked: Tensor) -> tuple[Tensor, list[Tensor | None]]:
        """The state each chunk of ``asked`` (sorted, distinct) starts from, ``[batch, asked, ...]`` float32, and
        their ``writes``: the loop over the chunks before ``end``, laid out first."""
        chunks = -(-end // self.chunk_size)
        self.lay_out(end)
        holds_asked = set(asked.tolist())
        state = (
            torch.zeros(self.shape, device=self.device) if self.initial_state is None else self.initial_state.float()
        )
        starts, asked_writes = [], []
        for chunk in range(chunks):
            writes = self.writes(state, chunk)
            if chunk in holds_asked:
                starts.append(state)
                asked_writes.append(writes)
            if chunk + 1 < chunks:
                state = self.carry(state, chunk, writes)
        return torch.stack(starts, dim=1), asked_writes

    def in_chunks(self, tensor: Tensor, dim: int) -> Tensor:
        """``tensor`` with its token axis ``dim`` padded with zeros to whole chunks and split into ``[chunks, chunk_size]``.

        A family lays its tokens out so that a zero padding token leaves the state as it is. The result is
        contiguous, whatever ``tensor``'s layout (a tokens-first view transposed to heads first, say): a batched
        matrix product copies a non-contiguous operand every time it reads it.
        """
        dim %= tensor.dim()
        padded = list(tensor.shape)
        padded[dim] += -tensor.shape[dim] % self.chunk_size
        result = tensor.new_zeros(padded)
        result.narrow(dim, 0, tensor.shape[dim]).copy_(tensor)
        return result.unflatten(dim, (-1, self.chunk_size))

    def lay_out(self, end: int) -> None:
        """Lay the tokens before ``end`` out in chunks, and prepare each chunk's carry."""
        raise NotImplementedError

    def writes(self, start: Tensor, chunk: int) -> Tensor | None:
        """What ``chunk``'s tokens write, where it depends on the state ``start`` the chunk starts from; else ``None``."""
        return None

    def carry(self, start: Tensor, chunk: int, writes: Tensor | None) -> Tensor:
        """The state ``chunk`` ends in, from the state ``start`` it starts in and its ``writes``."""
        raise NotImplementedError

    def steps(self, asked: Tensor, writes: list[Tensor | None]) -> Advance:
        """The ``Advance`` of the chunks ``asked`` (on ``device``): one token of each, from its start state.

        ``writes`` holds each asked chunk's ``writes``, in order.
        """
        raise NotImplementedError


@torch.no_grad()
def state_patch_estimates(clean: ChunkedRecurrence, corrupt: ChunkedRecurrence, adjoint: Iterator[Tensor]) -> Tensor:
    """``(corrupt S_t - clean S_t) . L_t`` per token and head, ``[batch, seq, heads]`` float32, a chunk of states at a time.

    ``clean`` and ``corrupt`` are two runs of one call (states ``[batch, heads,
    ...]``); ``adjoint`` yields the gradient ``L_t`` with respect to the clean
    run's state after each token, shaped as a state, from the last token back,
    each free to be written over once the next is asked for. Each token's
    estimate sums over its head's state. What the product would otherwise take, both runs' states
    and the adjoint after every token, is never held: one chunk of each run's states and one ``L_t``.
    """
    batch, heads = clean.shape[:2]
    estimates = torch.empty(batch, clean.seq_len, heads, device=clean.device)
    for (first, clean_states), (_, corrupt_states) in zip(
        clean.chunks_backwards(), corrupt.chunks_backwards(), strict=True
    ):
        patch = corrupt_states.sub_(clean_states).flatten(3)
        for offset in reversed(range(patch.shape[1])):
            estimates[:, first + offset] = torch.einsum("bhi,bhi->bh", patch[:, offset], next(adjoint).flatten(2))
    return estimates
