"""The state a Mamba-1 selective scan holds after each token, computed from the scan call's own arguments.

transformers' pure-torch ``mamba_selective_scan`` steps through the sequence one token per Python
iteration and keeps only the last state. ``selective_scan_states`` computes the states after any
chosen tokens from the same arguments, in float32, without a loop over the sequence.

Per channel c and state dimension n the scan is a scalar recurrence with its own decay::

    h_t = exp(dt_t A) * h_{t-1} + dt_t x_t B_t

where every factor but ``A`` depends on the token. No product of matrices mixes the state
dimensions, so it is a first-order linear recurrence, solved by a blocked scan in three passes:

1. all chunks at once, each from a zero state: a pass over the offsets within a chunk (one step
   advances every chunk by one token) leaves each chunk's own contribution to its end state;
2. a loop over chunks carries the state across them: ``h_end = exp(A * sum(dt)) * h_start + own``;
3. the chunks holding asked positions, at once, from their start states: a second pass over the
   offsets, up to the furthest asked one, gives the asked states
   (``nnterp.positions.write_chunk_states``).

Python loops ``2 * chunk_size + seq / chunk_size`` times, each step over a whole tensor. Each decay
is ``exp`` of a product of a non-negative step and a non-positive ``A``, never of a sum that can
grow positive, and the work and memory beyond the answer are a few states per chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nnterp.positions import Advance, Positions, asked_chunks, select_positions, write_chunk_states


def selective_scan_states(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    initial_state: Tensor | None = None,
    *,
    positions: Positions = None,
    dt_bias: Tensor | None = None,
    softplus: bool = True,
    chunk_size: int = 64,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The state after each token of one Mamba-1 scan call, ``[batch, positions, channels, state_dim]``.

    The arguments are ``mamba_selective_scan``'s, channel-first as the mixer passes them: ``x``
    and ``dt`` ``[batch, channels, seq]`` (``dt`` before its bias), ``A`` ``[channels, state_dim]``,
    ``B`` ``[batch, state_dim, seq]``; ``dt_bias`` (the kernel's ``delta_bias``, ``[channels]``) is
    added to ``dt`` and ``softplus`` (its ``delta_softplus``) applied in ``dt``'s dtype, as the kernel
    does, before the float32 arithmetic. ``initial_state`` ``[batch, channels, state_dim]`` is the
    state the call starts from, a decode step's cached one; ``None`` starts from zeros, as the scan
    does. ``C`` and ``D`` only read the state and are not needed.

    ``positions`` selects states as ``states[:, positions]`` would (an int drops the axis), and
    only those are computed. The result has ``x``'s dtype unless ``dtype`` says otherwise. Equal to
    the scan's token loop to float32 rounding.
    """
    batch, channels, seq_len = x.shape
    needed, order, single = select_positions(positions, seq_len)
    states = torch.empty(batch, len(needed), channels, A.shape[-1], dtype=dtype or x.dtype, device=x.device)
    if len(needed):
        _fill_states(states, needed, x, dt, A, B, initial_state, dt_bias, softplus, chunk_size)
    if order is not None:
        states = states[:, order]
    return states[:, 0] if single else states


def _fill_states(
    states: Tensor,
    needed: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    initial_state: Tensor | None,
    dt_bias: Tensor | None,
    softplus: bool,
    chunk_size: int,
) -> None:
    """Write the state after each of ``needed`` (sorted, distinct) into ``states[:, i]``."""
    batch, _, channels, state_dim = states.shape
    end = int(needed[-1]) + 1  # later tokens cannot change an earlier state
    pad = -end % chunk_size
    chunks = (end + pad) // chunk_size

    dt = dt[..., :end]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)[..., None]
    if softplus:
        dt = F.softplus(dt)
    step = dt.float()
    written = step * x[..., :end].float()
    # [batch, chunks, chunk, channels] and B as [batch, chunks, chunk, state_dim], laid out so in memory: offset o
    # of every chunk is one slice with its channels contiguous (a third faster than the channel-first views).
    # Padding tokens have a zero step: no decay and no write.
    step, written, keys = (
        F.pad(tensor, (0, pad)).unflatten(-1, (chunks, chunk_size)).permute(0, 2, 3, 1).contiguous()
        for tensor in (step, written, B[..., :end].float())
    )
    rate = A.float()  # [channels, state_dim]

    def scan(step: Tensor, written: Tensor, keys: Tensor) -> Advance:
        """One token of every chosen chunk, in place: decayed by exp(dt A), plus dt x B."""

        def advance(running: Tensor, chunks: slice, offset: int) -> None:
            decay = torch.exp(step[:, chunks, offset].unsqueeze(-1) * rate)
            running.mul_(decay).addcmul_(
                written[:, chunks, offset].unsqueeze(-1), keys[:, chunks, offset].unsqueeze(-2)
            )

        return advance

    # 1. every chunk but the last, from zero: what it adds to the state by its end
    before_last = slice(0, chunks - 1)
    own = torch.zeros(batch, chunks - 1, channels, state_dim, device=x.device)
    every_chunk = scan(step, written, keys)
    for offset in range(chunk_size if chunks > 1 else 0):
        every_chunk(own, before_last, offset)
    chunk_decay = torch.exp(step[:, before_last].sum(2).unsqueeze(-1) * rate)

    # 2. across chunks: the start state of each chunk holding an asked position
    asked = asked_chunks(needed, chunk_size)
    holds_asked = set(asked.tolist())
    state = torch.zeros(batch, channels, state_dim, device=x.device) if initial_state is None else initial_state.float()
    starts = []
    for chunk in range(chunks):
        if chunk in holds_asked:
            starts.append(state)
        if chunk + 1 < chunks:
            state = chunk_decay[:, chunk] * state + own[:, chunk]

    # 3. the asked chunks, from their start states, up to the furthest asked offset
    asked = asked.to(x.device)
    write_chunk_states(
        states, needed, chunk_size, torch.stack(starts, dim=1), scan(step[:, asked], written[:, asked], keys[:, asked])
    )
