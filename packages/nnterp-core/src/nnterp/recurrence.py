"""A linear recurrence computed chunk by chunk: the mechanism of every state trajectory, its math left to the family.

A state trajectory computes the state after chosen tokens of one kernel call from the call's own
arguments. Every family does it the same way, and ``ChunkedRecurrence`` holds that way: it lays the
tokens up to the last asked one out in chunks, carries the state across them in a loop over
chunks (not tokens), keeps the state each chunk holding an asked position starts from, and steps
those chunks together token by token (``nnterp.positions.write_chunk_states``). A family's
subclass supplies its math only: how its tokens lie in chunks, how a chunk carries its start state
to its end, and one token's step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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
        chunks = -(-end // self.chunk_size)
        self.lay_out(end)
        asked = asked_chunks(needed, self.chunk_size)
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
        advance = self.steps(asked.to(self.device), asked_writes)
        write_chunk_states(states, needed, self.chunk_size, torch.stack(starts, dim=1), advance)

    def in_chunks(self, tensor: Tensor, dim: int) -> Tensor:
        """``tensor`` with its token axis ``dim`` padded with zeros to whole chunks and split into ``[chunks, chunk_size]``.

        A family lays its tokens out so that a zero padding token leaves the state as it is.
        """
        dim %= tensor.dim()
        pad = -tensor.shape[dim] % self.chunk_size
        return F.pad(tensor, (0, 0) * (tensor.dim() - 1 - dim) + (0, pad)).unflatten(dim, (-1, self.chunk_size))

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
