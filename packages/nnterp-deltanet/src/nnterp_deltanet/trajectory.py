"""The state a gated delta rule holds after each token, computed from the kernel call's own arguments.

transformers' chunked delta-rule kernels (``torch_chunk_gated_delta_rule``, Kimi's
``chunk_kimi_delta_attention``) carry the state from one chunk to the next and never hold it per
token; only the token-by-token kernels do, one Python iteration per token. ``delta_rule_states``
gets the per-token states from the chunked algorithm instead.

Per head, with ``S`` a ``[key_dim, value_dim]`` matrix, each token ``t`` does::

    S = exp(g_t) * S                               (g_t a scalar, or one per key channel on KDA)
    S = S + k_t (beta_t * (v_t - k_t^T S))^T       (the delta rule: write what k_t does not yet retrieve)

Within a chunk, with ``G_t`` the cumulative log decay from the chunk's start (non-positive and
falling), the corrections ``delta_t = beta_t * (v_t - k_t^T S_before_t)`` solve a unit lower
triangular system (the UT transform of the WY representation) whose right side is affine in the
chunk's start state ``S_0``: ``delta = U - W S_0``, ``U`` and ``W`` depending on the chunk's keys,
values, betas and gates only. Every state in the chunk then follows from ``S_0``::

    S_t = exp(G_t) * S_0 + sum_{j <= t} (exp(G_t - G_j) * k_j) delta_j^T

The UT solve runs for every chunk at once. The chunk's end state (the sum above at its last
position, one matrix product) is the next chunk's start, so a loop over chunks (not tokens)
carries the state, a few operations per chunk. With the start states and the corrections known,
the sum above is a rank-one update per token, ``S_t = exp(g_t) * S_{t-1} + k_t delta_t^T``, and
``nnterp.positions.write_chunk_states`` steps every asked chunk through it at once: at most a
chunk's length of steps, whatever the call's length, each state copied into the result once.
Every exponent is ``G_t - G_j`` with ``j <= t``, ``G_t`` or ``g_t``, so no exp of a positive
number is taken.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nnterp.positions import Positions, asked_chunks, rank_one_steps, select_positions, write_chunk_states


def delta_rule_states(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    *,
    positions: Positions = None,
    use_qk_l2norm: bool = True,
    chunk_size: int = 64,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The state after each token of one delta-rule kernel call, ``[batch, positions, heads, key_dim, value_dim]``.

    The arguments are the kernel's, as the mixer's forward passes them: ``query`` and ``key``
    ``[batch, seq, key_heads, key_dim]`` (from transformers 5.23 with the mixer's ``num_k_heads``,
    repeated here to the value heads as the kernel does), ``value`` ``[batch, seq, heads, value_dim]``,
    ``g`` the log decay, ``[batch, seq, heads]``, or ``[batch, seq, heads, key_dim]`` for Kimi's
    per-channel gate, ``beta`` ``[batch, seq, heads]``, ``initial_state`` the state the call starts
    from, ``[batch, heads, key_dim, value_dim]``, or ``None`` for zeros. ``use_qk_l2norm`` is the
    kernel's ``use_qk_l2norm_in_kernel``: the keys are l2-normalized before the rule. The queries
    only read the state, so they decide nothing here but the default dtype.

    ``positions`` selects states as ``states[:, positions]`` would (an int drops the axis), and
    only those are computed: the loop over chunks stops at the last one asked for and holds one
    state per chunk. The arithmetic is float32; the result has ``query``'s dtype, as the kernel's
    output does, unless ``dtype`` says otherwise. Equal to the token-by-token kernel's states to
    float32 rounding.
    """
    batch, seq_len, key_heads, key_dim = key.shape
    heads, value_dim = value.shape[-2:]
    if heads % key_heads:
        raise ValueError(
            f"value has {heads} heads and key {key_heads}: the kernel repeats each key head over "
            f"{heads} // {key_heads} value heads, so the value heads must be a multiple of the key heads"
        )
    needed, order, single = select_positions(positions, seq_len)
    states = torch.empty(batch, len(needed), heads, key_dim, value_dim, dtype=dtype or query.dtype, device=value.device)
    if len(needed):
        _fill_states(states, needed, key, value, g, beta, initial_state, use_qk_l2norm, chunk_size)
    if order is not None:
        states = states[:, order]
    return states[:, 0] if single else states


def _fill_states(
    states: Tensor,
    needed: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None,
    use_qk_l2norm: bool,
    chunk_size: int,
) -> None:
    """Write the state after each of ``needed`` (sorted, distinct) into ``states[:, i]``."""
    batch, _, heads, key_dim, value_dim = states.shape
    device = key.device
    end = int(needed[-1]) + 1  # later tokens cannot change an earlier state
    pad = -end % chunk_size
    chunks = (end + pad) // chunk_size

    key = key[:, :end].repeat_interleave(heads // key.shape[2], dim=2)
    key = key.transpose(1, 2).float()
    if use_qk_l2norm:
        key = key * torch.rsqrt((key * key).sum(-1, keepdim=True) + 1e-6)
    per_channel = g.dim() == 4
    # [batch, heads, seq, gates]: one gate per head, or one per key channel
    gate = g[:, :end].float().transpose(1, 2)
    gate = gate if per_channel else gate.unsqueeze(-1)
    beta = beta[:, :end].float().transpose(1, 2).unsqueeze(-1)
    value = value[:, :end].float().transpose(1, 2)
    # [batch, heads, chunks, chunk, ...]. Padding tokens have a zero key, beta and log decay: they
    # leave the state as it is.
    key, value, beta, gate = (
        F.pad(tensor, (0, 0, 0, pad)).unflatten(2, (chunks, chunk_size)) for tensor in (key, value, beta, gate)
    )
    cumulative = gate.cumsum(dim=3)
    key_beta = key * beta
    later = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=device).triu(1)

    # The UT transform of every chunk in one triangular solve: its right side holds the chunk's
    # corrections from a zero start state, and the map from the start state to what they lose.
    solved = torch.linalg.solve_triangular(
        _ut_system(key, key_beta, cumulative, later),
        torch.cat([value * beta, key_beta * cumulative.exp()], dim=-1),
        upper=False,
        unitriangular=True,
    )
    from_zero, start_read = solved[..., :value_dim], solved[..., value_dim:]
    last = cumulative[:, :, :, -1:]  # [batch, heads, chunks, 1, gates]
    chunk_decay = last.exp().transpose(-1, -2)
    end_keys = (key * (last - cumulative).exp()).transpose(-1, -2)

    asked = asked_chunks(needed, chunk_size)
    holds_asked = set(asked.tolist())
    state = (
        torch.zeros(batch, heads, key_dim, value_dim, device=device) if initial_state is None else initial_state.float()
    )
    starts, asked_corrections = [], []
    for chunk in range(chunks):
        corrections = from_zero[:, :, chunk] - start_read[:, :, chunk] @ state
        if chunk in holds_asked:
            starts.append(state)
            asked_corrections.append(corrections)
        if chunk + 1 < chunks:
            state = chunk_decay[:, :, chunk] * state + end_keys[:, :, chunk] @ corrections

    # Within a chunk each token decays the state by its gate and writes its key times its correction.
    asked = asked.to(device)

    def per_token(tensor: Tensor) -> Tensor:  # [batch, heads, chunks, chunk, n] -> [batch, asked, chunk, heads, n]
        return tensor[:, :, asked].permute(0, 2, 3, 1, 4)

    write_chunk_states(
        states,
        needed,
        chunk_size,
        torch.stack(starts, dim=1),
        rank_one_steps(
            per_token(gate).exp().unsqueeze(-1),
            per_token(key).unsqueeze(-1),
            torch.stack(asked_corrections, dim=1).transpose(2, 3).unsqueeze(-2),
        ),
    )


def _pairwise_decay(rows: Tensor, columns: Tensor, after: Tensor) -> Tensor:
    """``exp(G_t - G_j)`` for each row position t and column position j, 0 where ``after`` says j comes after t.

    ``rows`` and ``columns`` are cumulative log decays ``[..., positions, gates]``; the result is
    ``[..., rows, columns, gates]``. A later column's difference is positive, so it is masked
    before the exp, never after.
    """
    difference = rows.unsqueeze(-2) - columns.unsqueeze(-3)
    return difference.masked_fill(after.unsqueeze(-1), float("-inf")).exp()


def _ut_system(key: Tensor, key_beta: Tensor, cumulative: Tensor, later: Tensor) -> Tensor:
    """Each chunk's ``[chunk, chunk]`` lower triangle: how much token j's write changes what token t's key reads.

    With one gate per head the decay factors out of the key products; with one per key channel
    (KDA) it does not, and the ``[chunk, chunk, key_dim]`` decays are formed one chunk at a time
    so that they never exist for the whole sequence at once.
    """
    if cumulative.shape[-1] == 1:
        decay = _pairwise_decay(cumulative, cumulative, later).squeeze(-1)
        return (key_beta @ key.transpose(-1, -2)) * decay
    return torch.stack(
        [
            (
                key_beta[:, :, chunk].unsqueeze(-2)
                * _pairwise_decay(gates, gates, later)
                * key[:, :, chunk].unsqueeze(-3)
            ).sum(-1)
            for chunk, gates in enumerate(cumulative.unbind(2))
        ],
        dim=2,
    )
