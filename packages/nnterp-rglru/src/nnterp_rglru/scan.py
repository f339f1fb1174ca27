"""The RG-LRU's linear recurrence, computed from its scan call's own arguments: states, token mixing, readout.

RecurrentGemma's ``_rnn_scan(hidden_states, recurrent_gate, reset, recurrent_states)`` runs, per
channel and token, in float32::

    h_t = a'_t * h_{t-1} + x_t        a'_t = a_t * (not reset_t)

where ``x`` is the scan's input (the gated, normalized ``i_t * sqrt(1 - a_t^2) * x_t`` the RG-LRU
computes before the call), ``a`` the recurrence gate and ``reset`` marks a document's first token
(position 0), where the state starts over. Every channel is its own scalar recurrence: no sum mixes
channels, so unrolled it is exactly::

    h_t = sum_{j <= t} (prod_{j < k <= t} a'_k) x_j  +  (prod_{k <= t} a'_k) h_{-1}

The first sum is the token mixing over the scan's inputs, the second the offset: the readout of the
state the call starts from. The output of the scan at token t is ``h_t`` itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nnterp.analysis.mixing import TokenMixing
from nnterp.positions import Advance, Positions
from nnterp.recurrence import ChunkedRecurrence


def effective_gate(recurrent_gate: Tensor, reset: Tensor) -> Tensor:
    """``a * (not reset)`` as the kernel forms it, in the gate's dtype, then float32: [batch, seq, channels]."""
    return (recurrent_gate * ~reset).float()


def rglru_states(
    x: Tensor,
    recurrent_gate: Tensor,
    reset: Tensor,
    initial_state: Tensor | None = None,
    *,
    positions: Positions = None,
    chunk_size: int = 32,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The state after each token of one RG-LRU scan call, ``[batch, positions, channels]``.

    The arguments are ``_rnn_scan``'s: ``x`` (its ``hidden_states``) and ``recurrent_gate``
    ``[batch, seq, channels]``, ``reset`` ``[batch, seq, 1]`` booleans, ``initial_state``
    ``[batch, channels]`` (its ``recurrent_states``; ``None`` for zeros). ``positions`` selects as
    ``states[:, positions]`` would (an int drops the axis), and only those are computed, with a loop
    over ``2 * chunk_size + seq / chunk_size`` steps rather than ``seq``. float32 (the scan's
    accumulation dtype) unless ``dtype`` says otherwise; equal to the scan's loop to float32 rounding.
    """
    return _Scan(x, recurrent_gate, reset, initial_state, chunk_size, dtype or torch.float32).states(positions)


class _Scan(ChunkedRecurrence):
    """One scan call as a chunked recurrence over its ``[batch, channels]`` state."""

    def __init__(
        self,
        x: Tensor,
        recurrent_gate: Tensor,
        reset: Tensor,
        initial_state: Tensor | None,
        chunk_size: int,
        dtype: torch.dtype,
    ) -> None:
        batch, seq, channels = x.shape
        super().__init__(seq, (batch, channels), initial_state, chunk_size, dtype, x.device)
        self.x, self.gate, self.reset = x, recurrent_gate, reset

    def lay_out(self, end: int) -> None:
        """Gates and inputs by chunk ``[batch, chunks, chunk, channels]``; pass 1: each chunk's own end state."""
        # a padding token past the end has a gate of 1 and an input of 0: the state stays as it is
        gate = effective_gate(self.gate[:, :end], self.reset[:, :end]) - 1
        self.gates = self.in_chunks(gate, 1) + 1
        self.inputs = self.in_chunks(self.x[:, :end].float(), 1)
        batch, chunks = self.gates.shape[:2]
        self.own = torch.zeros(batch, chunks, self.shape[1], device=self.device)
        advance = self._advance(self.gates, self.inputs)
        for offset in range(self.chunk_size if chunks > 1 else 0):
            advance(self.own, slice(None), offset)
        self.chunk_gate = self.gates.prod(2)

    def carry(self, start: Tensor, chunk: int, writes: None) -> Tensor:
        """Across a chunk: its gates' product times the start state, plus what it wrote from zero."""
        return self.chunk_gate[:, chunk] * start + self.own[:, chunk]

    def steps(self, asked: Tensor, writes: list[None]) -> Advance:
        return self._advance(self.gates[:, asked], self.inputs[:, asked])

    @staticmethod
    def _advance(gates: Tensor, inputs: Tensor) -> Advance:
        def advance(running: Tensor, chunks: slice, offset: int) -> None:
            running.mul_(gates[:, chunks, offset]).add_(inputs[:, chunks, offset])

        return advance


def rglru_mixing(
    recurrent_gate: Tensor, reset: Tensor, initial_state: Tensor | None, rows: Tensor, channels: Tensor
) -> TokenMixing:
    """The token mixing of one scan call at ``rows`` and ``channels``, over its inputs, in float32.

    ``M[b, c, i, j] = prod_{j < k <= rows[i]} a'_k`` for ``j <= rows[i]``, zero after; the offset
    ``[batch, rows, channels]`` is ``prod_{k <= rows[i]} a'_k`` times ``initial_state`` (zero without
    one). ``rows`` are sorted, distinct positions of the call, ``channels`` channel indices.
    """
    gate = effective_gate(recurrent_gate, reset)[..., channels.to(recurrent_gate.device)]  # [batch, seq, chosen]
    batch, seq, width = gate.shape
    matrix = torch.zeros(batch, width, len(rows), seq, device=gate.device)
    offset = torch.zeros(batch, len(rows), width, device=gate.device)
    entering = None if initial_state is None else initial_state[:, channels].float()
    for i, row in enumerate(rows.tolist()):
        # prod_{j < k <= row} a'_k for j = row, row - 1, ..., -1: a cumulative product backwards from the row
        backwards = torch.cat([torch.ones_like(gate[:, :1]), gate[:, : row + 1].flip(1)], 1).cumprod(1)
        matrix[:, :, i, : row + 1] = backwards[:, :-1].flip(1).transpose(1, 2)
        if entering is not None:
            offset[:, i] = backwards[:, -1] * entering
    return TokenMixing(matrix, offset)


def rglru_readout(state: Tensor, rows: Tensor) -> Tensor:
    """The scan's output at ``rows`` were ``state`` ``[batch, channels]`` the state after each row, float32.

    The RG-LRU's output at a token is its state after the token, read by no query: ``state`` itself at every row,
    ``[batch, rows, channels]``.
    """
    return state.float()[:, None].expand(-1, len(rows), -1)


def reference_scan(
    x: Tensor, recurrent_gate: Tensor, reset: Tensor, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The Griffin paper's recurrence, token by token in float64: (the state after every token, the last).

    A test's reference, written from the equations rather than from transformers' loop.
    """
    gate = recurrent_gate.double() * (~reset).double()
    state = torch.zeros_like(x[:, 0], dtype=torch.float64) if initial_state is None else initial_state.double()
    states = []
    for t in range(x.shape[1]):
        state = gate[:, t] * state + x[:, t].double()
        states.append(state)
    return torch.stack(states, 1), state
