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
them. Then ``nnterp.positions.write_chunk_states`` steps every asked chunk from its start state
through the per-token update above at once: at most a chunk's length of steps, whatever the
call's length, each state copied into the result once. Every exponent is ``G_t - G_j`` with
``j <= t``, ``G_t`` or ``dt_t A``, so no exp of a positive number is taken.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nnterp.positions import Positions, asked_chunks, rank_one_steps, select_positions, write_chunk_states


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
    batch, seq_len, heads, head_dim = hidden_states.shape
    needed, order, single = select_positions(positions, seq_len)
    states = torch.empty(
        batch,
        len(needed),
        heads,
        B.shape[-1],
        head_dim,
        dtype=dtype or hidden_states.dtype,
        device=hidden_states.device,
    )
    if len(needed):
        _fill_states(states, needed, hidden_states, dt, A, B, initial_state, dt_bias, softplus, dt_limit, chunk_size)
    if order is not None:
        states = states[:, order]
    return states[:, 0] if single else states


def _fill_states(
    states: Tensor,
    needed: Tensor,
    hidden_states: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    initial_state: Tensor | None,
    dt_bias: Tensor | None,
    softplus: bool,
    dt_limit: tuple[float, float],
    chunk_size: int,
) -> None:
    """Write the state after each of ``needed`` (sorted, distinct) into ``states[:, i]``."""
    batch, _, heads, state_dim, head_dim = states.shape
    device = hidden_states.device
    end = int(needed[-1]) + 1  # later tokens cannot change an earlier state
    pad = -end % chunk_size
    chunks = (end + pad) // chunk_size

    dt = dt[:, :end]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if softplus:
        dt = F.softplus(dt)
    step = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    written = (hidden_states[:, :end].float() * step.unsqueeze(-1)).transpose(1, 2)
    log_decay = (A.float() * step).transpose(1, 2)
    # [batch, heads, chunks, chunk, head_dim], [batch, heads, chunks, chunk], and B as
    # [batch, heads, chunks, chunk, state_dim] (each group repeated over its heads). Padding
    # tokens have a zero step: no decay and no write.
    written = F.pad(written, (0, 0, 0, pad)).unflatten(2, (chunks, chunk_size))
    log_decay = F.pad(log_decay, (0, pad)).unflatten(2, (chunks, chunk_size))
    cumulative = log_decay.cumsum(-1)
    keys = F.pad(B[:, :end].float().transpose(1, 2), (0, 0, 0, pad)).unflatten(2, (chunks, chunk_size))
    keys = keys.repeat_interleave(heads // B.shape[2], dim=1)
    last = cumulative[..., -1:]
    chunk_decay = last.exp().unsqueeze(-1)  # [batch, heads, chunks, 1, 1]
    # each chunk's end state from a zero start
    own = keys.transpose(-1, -2) @ ((last - cumulative).exp().unsqueeze(-1) * written)

    asked = asked_chunks(needed, chunk_size)
    holds_asked = set(asked.tolist())
    state = (
        torch.zeros(batch, heads, state_dim, head_dim, device=device)
        if initial_state is None
        else initial_state.float().transpose(-1, -2)
    )
    starts = []
    for chunk in range(chunks):
        if chunk in holds_asked:
            starts.append(state)
        if chunk + 1 < chunks:
            state = torch.addcmul(own[:, :, chunk], chunk_decay[:, :, chunk], state)

    # Within a chunk each token decays the state by exp(dt A) and writes B times dt x.
    asked = asked.to(device)

    def per_token(tensor: Tensor) -> Tensor:  # [batch, heads, chunks, chunk, ...] -> [batch, asked, chunk, heads, ...]
        return tensor[:, :, asked].movedim(1, 3)

    write_chunk_states(
        states,
        needed,
        chunk_size,
        torch.stack(starts, dim=1),
        rank_one_steps(
            per_token(log_decay).exp()[..., None, None],
            per_token(keys).unsqueeze(-1),
            per_token(written).unsqueeze(-2),
        ),
    )
