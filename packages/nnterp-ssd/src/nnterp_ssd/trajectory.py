"""The state a Mamba-2 (SSD) scan holds after each token, computed from the chunk scan call's own arguments.

transformers' pure-torch ``mamba2_chunk_scan`` materializes the state only at its chunk boundaries
(every token only with ``chunk_size=1``, at a cost quadratic in the number of chunks).
``ssd_states`` computes the states after any chosen tokens from the same arguments, in float32.

Per head, with the state ``h`` a ``[state_dim, head_dim]`` matrix (key side first) and one
scalar decay per head and token, each token does::

    h_t = exp(dt_t A) h_{t-1} + B_t (dt_t x_t)^T

With ``G_t`` the cumulative log decay ``sum(dt A)`` from the start of a chunk (non-positive and
falling), every state in the chunk follows from the chunk's start state::

    h_t = exp(G_t) h_0 + sum_{j <= t} exp(G_t - G_j) B_j (dt_j x_j)^T

Each chunk's own contribution to its end state comes from every chunk at once (one matrix
product); a loop over chunks (not tokens), one operation per chunk, carries the state across
them. Then every asked chunk steps from its start state through the per-token update above at
once: at most a chunk's length of steps, whatever the call's length, each state copied into the
result once. ``nnterp.recurrence.ChunkedRecurrence`` runs the loop and the steps; ``_SSDScan``
supplies this math. Every exponent is ``G_t - G_j`` with ``j <= t``, ``G_t`` or ``dt_t A``, so
no exp of a positive number is taken.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nnterp.positions import Advance, Positions, rank_one_steps
from nnterp.recurrence import ChunkedRecurrence


def ssd_states(
    hidden_states: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    initial_state: Tensor | None = None,
    *,
    positions: Positions = None,
    dt_bias: Tensor | None = None,
    softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    chunk_size: int = 64,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The state after each token of one Mamba-2 scan call, ``[batch, positions, heads, state_dim, head_dim]``.

    The arguments are ``mamba2_chunk_scan``'s: ``hidden_states`` (x) ``[batch, seq, heads, head_dim]``,
    ``dt`` ``[batch, seq, heads]`` before its bias, ``A`` ``[heads]``, ``B`` ``[batch, seq, groups, state_dim]``
    (each group shared by ``heads // groups`` consecutive heads); ``dt_bias`` ``[heads]`` is added,
    ``softplus`` (the scan's ``dt_softplus``) applied and ``dt`` clamped to ``dt_limit`` in ``dt``'s
    dtype, as the scan does, before the float32 arithmetic. ``initial_state`` is the scan's
    ``initial_states``, in the cache's layout ``[batch, heads, head_dim, state_dim]``; ``None`` starts
    from zeros. The states come key side first, ``[state_dim, head_dim]`` per head: the transpose of
    the cache's. ``C`` and ``D`` only read the state and are not needed; ``chunk_size`` is this
    computation's, free of the model's.

    ``positions`` selects states as ``states[:, positions]`` would (an int drops the axis), and
    only those are computed: the loop over chunks stops at the last one asked for and holds one
    state per chunk. The result has ``hidden_states``' dtype unless ``dtype`` says otherwise.
    Equal to the token-by-token recurrence to float32 rounding.
    """
    return _SSDScan(
        hidden_states, dt, A, B, initial_state, dt_bias, softplus, dt_limit, chunk_size, dtype or hidden_states.dtype
    ).states(positions)


def step_sizes(
    dt: Tensor, dt_bias: Tensor | None, softplus: bool, dt_limit: tuple[float, float] = (0.0, float("inf"))
) -> Tensor:
    """The step size the scan computes from its raw ``dt`` argument, float32, in ``dt``'s layout (``[batch, seq, heads]``).

    ``dt_bias`` is added, the softplus applied and the result clamped to ``dt_limit`` in ``dt``'s own
    dtype, as the scan does, and only then cast: in bfloat16 the step is the kernel's rounded one.
    """
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if softplus:
        dt = F.softplus(dt)
    return torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()


class _SSDScan(ChunkedRecurrence):
    """One Mamba-2 scan call as a chunked recurrence: its state ``[batch, heads, state_dim, head_dim]``."""

    def __init__(
        self,
        hidden_states: Tensor,
        dt: Tensor,
        A: Tensor,
        B: Tensor,
        initial_state: Tensor | None,
        dt_bias: Tensor | None,
        softplus: bool,
        dt_limit: tuple[float, float],
        chunk_size: int,
        dtype: torch.dtype,
    ) -> None:
        batch, seq_len, heads, head_dim = hidden_states.shape
        super().__init__(
            seq_len,
            (batch, heads, B.shape[-1], head_dim),
            None if initial_state is None else initial_state.transpose(-1, -2),
            chunk_size,
            dtype,
            hidden_states.device,
        )
        self.hidden_states, self.dt, self.A, self.B = hidden_states, dt, A, B
        self.dt_bias, self.softplus, self.dt_limit = dt_bias, softplus, dt_limit

    def lay_out(self, end: int) -> None:
        """Log decays, writes ``dt x`` and keys ``B`` by chunk, and each chunk's end state from a zero start."""
        step = step_sizes(self.dt[:, :end], self.dt_bias, self.softplus, self.dt_limit)
        written = (self.hidden_states[:, :end].float() * step.unsqueeze(-1)).transpose(1, 2)
        log_decay = (self.A.float() * step).transpose(1, 2)
        # [batch, heads, chunks, chunk, head_dim], [batch, heads, chunks, chunk], and B as
        # [batch, heads, chunks, chunk, state_dim] (each group repeated over its heads). Padding
        # tokens have a zero step: no decay and no write.
        self.written = self.in_chunks(written, 2)
        self.log_decay = self.in_chunks(log_decay, 2)
        cumulative = self.log_decay.cumsum(-1)
        keys = self.in_chunks(self.B[:, :end].float().transpose(1, 2), 2)
        self.keys = keys.repeat_interleave(self.shape[1] // self.B.shape[2], dim=1)
        last = cumulative[..., -1:]
        self.chunk_decay = last.exp().unsqueeze(-1)  # [batch, heads, chunks, 1, 1]
        self.own = self.keys.transpose(-1, -2) @ ((last - cumulative).exp().unsqueeze(-1) * self.written)

    def carry(self, start: Tensor, chunk: int, writes: None) -> Tensor:
        """``h_end = exp(G_last) h_0 + own``."""
        return torch.addcmul(self.own[:, :, chunk], self.chunk_decay[:, :, chunk], start)

    def steps(self, asked: Tensor, writes: list[None]) -> Advance:
        """Each token decays the state by exp(dt A) and writes B times dt x."""

        def per_token(
            tensor: Tensor,
        ) -> Tensor:  # [batch, heads, chunks, chunk, ...] -> [batch, asked, chunk, heads, ...]
            return tensor[:, :, asked].movedim(1, 3)

        return rank_one_steps(
            per_token(self.log_decay).exp()[..., None, None],
            per_token(self.keys).unsqueeze(-1),
            per_token(self.written).unsqueeze(-2),
        )
