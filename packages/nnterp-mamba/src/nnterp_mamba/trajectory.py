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
   offsets, up to the furthest asked one, gives the asked states.

``nnterp.recurrence.ChunkedRecurrence`` runs passes 2 and 3; ``_SelectiveScan`` supplies the math.

Python loops ``2 * chunk_size + seq / chunk_size`` times, each step over a whole tensor. Each decay
is ``exp`` of a product of a non-negative step and a non-positive ``A``, never of a sum that can
grow positive, and the work and memory beyond the answer are a few states per chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nnterp.positions import Advance, Positions
from nnterp.recurrence import ChunkedRecurrence


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
    return _SelectiveScan(x, dt, A, B, initial_state, dt_bias, softplus, chunk_size, dtype or x.dtype).states(positions)


def step_sizes(dt: Tensor, dt_bias: Tensor | None, softplus: bool, dtype: torch.dtype = torch.float32) -> Tensor:
    """The scan's step per channel and token, ``[batch, channels, seq]`` in ``dtype``, as the kernel derives it.

    ``dt`` ``[batch, channels, seq]`` is the kernel's argument, ``dt_bias`` ``[channels]`` its
    ``delta_bias``, ``softplus`` its ``delta_softplus``: both are applied in ``dt``'s dtype, as the
    kernel applies them, before the arithmetic in ``dtype``; computing them in float32 instead would
    differ from the kernel by ``dt``'s rounding.
    """
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)[..., None]
    if softplus:
        dt = F.softplus(dt)
    return dt.to(dtype)


class _SelectiveScan(ChunkedRecurrence):
    """One Mamba-1 scan call as a chunked recurrence: its state ``[batch, channels, state_dim]``."""

    def __init__(
        self,
        x: Tensor,
        dt: Tensor,
        A: Tensor,
        B: Tensor,
        initial_state: Tensor | None,
        dt_bias: Tensor | None,
        softplus: bool,
        chunk_size: int,
        dtype: torch.dtype,
    ) -> None:
        batch, channels, seq_len = x.shape
        super().__init__(seq_len, (batch, channels, A.shape[-1]), initial_state, chunk_size, dtype, x.device)
        self.x, self.dt, self.B, self.dt_bias, self.softplus = x, dt, B, dt_bias, softplus
        self.rate = A.float()  # [channels, state_dim]

    def lay_out(self, end: int) -> None:
        """Steps, writes ``dt x`` and keys ``B`` by chunk, and pass 1: what each chunk but the last adds to the state."""
        step = step_sizes(self.dt[..., :end], self.dt_bias, self.softplus)
        written = step * self.x[..., :end].float()
        # [batch, chunks, chunk, channels] and B as [batch, chunks, chunk, state_dim], laid out so in memory: offset o
        # of every chunk is one slice with its channels contiguous (a third faster than the channel-first views).
        # Padding tokens have a zero step: no decay and no write.
        self.step, self.written, self.keys = (
            self.in_chunks(tensor, -1).permute(0, 2, 3, 1).contiguous()
            for tensor in (step, written, self.B[..., :end].float())
        )

        # 1. every chunk but the last, from zero: what it adds to the state by its end
        batch, chunks = self.step.shape[:2]
        before_last = slice(0, chunks - 1)
        self.own = torch.zeros(batch, chunks - 1, *self.shape[1:], device=self.device)
        every_chunk = self._scan(self.step, self.written, self.keys)
        for offset in range(self.chunk_size if chunks > 1 else 0):
            every_chunk(self.own, before_last, offset)
        self.chunk_decay = torch.exp(self.step[:, before_last].sum(2).unsqueeze(-1) * self.rate)

    def carry(self, start: Tensor, chunk: int, writes: None) -> Tensor:
        """2. across chunks: ``h_end = exp(A * sum(dt)) * h_start + own``."""
        return self.chunk_decay[:, chunk] * start + self.own[:, chunk]

    def steps(self, asked: Tensor, writes: list[None]) -> Advance:
        """3. the asked chunks, from their start states."""
        return self._scan(self.step[:, asked], self.written[:, asked], self.keys[:, asked])

    def _scan(self, step: Tensor, written: Tensor, keys: Tensor) -> Advance:
        """One token of every chosen chunk, in place: decayed by exp(dt A), plus dt x B."""

        def advance(running: Tensor, chunks: slice, offset: int) -> None:
            decay = torch.exp(step[:, chunks, offset].unsqueeze(-1) * self.rate)
            running.mul_(decay).addcmul_(
                written[:, chunks, offset].unsqueeze(-1), keys[:, chunks, offset].unsqueeze(-2)
            )

        return advance


def entering_contribution(
    dt: Tensor,
    A: Tensor,
    C: Tensor,
    state: Tensor,
    *,
    dt_bias: Tensor | None = None,
    softplus: bool = True,
    block: int = 16,
) -> tuple[Tensor, Tensor]:
    """What entering a scan call with ``state`` adds to it: ``(C_t . h_t per token [batch, channels, seq], h_last)``.

    The scan is linear in the state it starts from: entered with ``state``
    instead of zeros, every state gains ``h_t = exp(A * (dt_1 + ... + dt_t)) *
    state``, which the decays alone carry (no token writes into it), and
    every output gains its readout ``C_t . h_t`` (``D x`` and the gate are the
    call's own). The arguments are the scan's, as ``selective_scan_states``
    takes them, with ``C`` ``[batch, state_dim, seq]`` and ``state``
    ``[batch, channels, state_dim]``. Computed in float32 ``block`` tokens at
    a time, so the decayed states ``[batch, channels, block, state_dim]``
    never exceed a block: a block of 16 rows of Mamba-1's 1536 channels stays
    in a CPU's cache from its ``exp`` to its readout, whose product is taken in
    place (the ``exp``'s own output is kept for its gradient). Rows that repeat the first (a prompt repeated, as
    ``knockout`` repeats it, in the blocks before the knocked tokens differ)
    are computed once.
    """
    rows = dt.shape[0]
    if rows > 1 and all(torch.equal(tensor, tensor[:1].expand_as(tensor)) for tensor in (dt, C, state)):
        outputs, final = entering_contribution(dt[:1], A, C[:1], state[:1], dt_bias=dt_bias, softplus=softplus)
        return outputs.expand(rows, -1, -1), final.expand(rows, -1, -1)
    elapsed = step_sizes(dt, dt_bias, softplus).cumsum(-1)  # [batch, channels, seq]
    rate, entering = A.float()[:, None, :], state.float()[:, :, None, :]  # [channels, 1, n], [batch, channels, 1, n]
    reading = C.float().transpose(1, 2)[:, None]  # [batch, 1, seq, n]
    readouts = []
    for start in range(0, elapsed.shape[-1], block):
        decayed = torch.exp(elapsed[..., start : start + block, None] * rate) * entering
        readouts.append(decayed.mul_(reading[:, :, start : start + block]).sum(-1))
    final = torch.exp(elapsed[..., -1, None] * A.float()) * state.float()
    return torch.cat(readouts, dim=-1), final


#: How much of the decays (and then states) ``selective_scan_head_outputs`` makes at once: a block that stays in a CPU's
#: cache from its ``exp`` to its readout.
BLOCK_BYTES = 1 << 20


@torch.no_grad()
def selective_scan_head_outputs(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    initial_state: Tensor | None = None,
    *,
    dt_bias: Tensor | None = None,
    softplus: bool = True,
) -> tuple[Tensor, Tensor]:
    """The scan's ``y = C . h + D x`` before its gate, ``[batch, channels, seq]``, and its last state, from ``initial_state``.

    The arguments are the scan's, as ``selective_scan_states`` takes them,
    with ``C`` ``[batch, state_dim, seq]`` and ``D`` ``[channels]``;
    ``initial_state`` ``[batch, channels, state_dim]`` is the state the scan
    continues from (``None``: zeros, as the kernel starts). Computed, and
    returned, in ``x``'s precision and at least float32, as the kernel
    computes. Without gradients. The same token loop as transformers'
    pure-torch scan, in blocks of tokens whose decays, writes and states stay
    within ``BLOCK_BYTES``, laid out token by token (each token's one
    contiguous ``[batch, channels, state_dim]`` slice, the block's states
    written over its decays). transformers' loop makes the prompt's decays and
    writes whole and slices them along their token axis, a strided read of a
    state's size per token: at Mamba-1's 1536 channels, 256 tokens take it 66
    ms here, this 19 ms. Equal to it to rounding.
    """
    batch, channels, seq = x.shape
    compute = torch.promote_types(x.dtype, torch.float32)
    block = max(1, BLOCK_BYTES // (batch * channels * A.shape[-1] * compute.itemsize))
    # tokens first and contiguous, so that the block's products are too: from channel-first views they would keep
    # the channel-first layout, and each token's slice would be scattered across the block
    step = tokens_first(step_sizes(dt, dt_bias, softplus, compute), compute)  # [batch, seq, channels]
    written = step * x.to(compute).transpose(1, 2)
    rate = A.to(compute)
    keys, reading = (tokens_first(value, compute) for value in (B, C))  # [batch, seq, state_dim]
    state = x.new_zeros(batch, channels, A.shape[-1], dtype=compute)
    if initial_state is not None:
        state.copy_(initial_state)
    outputs = x.new_empty(batch, seq, channels, dtype=compute)
    for start in range(0, seq, block):
        stop = min(seq, start + block)
        states = torch.exp(step[:, start:stop, :, None] * rate)  # the block's decays, then its states
        writes = written[:, start:stop, :, None] * keys[:, start:stop, None, :]
        for offset in range(stop - start):
            states[:, offset] = state.mul_(states[:, offset]).add_(writes[:, offset])
        torch.matmul(states, reading[:, start:stop, :, None], out=outputs[:, start:stop, :, None])
    y = outputs.transpose(1, 2)
    return y if D is None else y + D.to(compute)[:, None] * x.to(compute), state


def tokens_first(value: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``[batch, width, seq]`` as a contiguous ``[batch, seq, width]`` in ``dtype``: each token's row in one place, so
    the products that make a state-sized tensor from it lay every token's slice out contiguously, as the token loops
    read them (a product of channel-first views would keep their layout)."""
    return value.to(dtype).transpose(1, 2).contiguous()


def gated(y: Tensor, z: Tensor | None) -> Tensor:
    """The scan's head outputs ``y`` gated as the kernel gates them, by ``silu(z)``: its output."""
    return y if z is None else y * F.silu(z.to(y.dtype))
