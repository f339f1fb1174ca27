"""The mLSTM's stabilized recurrence, computed from a call's arguments: states, token mixing, readout.

Per head, with the kernel's pre-activations ``i`` (input gate) and ``f``
(forget gate), ``q`` scaled by ``1 / sqrt(key_dim)``, and the state
``(C, n, m)``::

    m_t = max(logsigmoid(f_t) + m_{t-1}, i_t)
    C_t = exp(logsigmoid(f_t) + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T
    n_t = exp(logsigmoid(f_t) + m_{t-1} - m_t) n_{t-1} + exp(i_t - m_t) k_t
    h_t = q_t C_t / (max(|q_t . n_t|, exp(-m_t)) + eps)

``C`` and ``n`` are the unstabilized memory and normalizer times
``exp(-m_t)``; ``h`` does not depend on the stabilizer but through the floor
``exp(-m_t)``. Tensors are in the kernel's layout: ``[batch, heads, seq, dim]``
for q, k, v and ``[batch, heads, seq]`` for the gates.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

#: Tokens per block of ``mlstm_states``: each block's states are one matrix product over its tokens.
BLOCK = 32


def stabilizers(igate: torch.Tensor, fgate: torch.Tensor, m0: torch.Tensor | None) -> torch.Tensor:
    """The max-state ``m_t`` after every token, [batch, heads, seq], from the state's ``m0`` ([batch, heads, 1]) or 0.

    ``m_t - F_t = max(m_{t-1} - F_{t-1}, i_t - F_t)`` with ``F`` the cumulative
    log forget gate, so ``m_t = F_t + max(m0, max_{j <= t} (i_j - F_j))``: a
    running max, without a loop over tokens.
    """
    cumulative = F.logsigmoid(fgate).cumsum(-1)
    start = igate.new_zeros(igate.shape[:2]) if m0 is None else m0[..., 0].to(igate.dtype)
    running = torch.maximum((igate - cumulative).cummax(-1).values, start[..., None])
    return cumulative + running


def _weights(igate: torch.Tensor, fgate: torch.Tensor, m0: torch.Tensor | None, m: torch.Tensor) -> tuple:
    """``w[t, j] = exp(F_t - F_j + i_j - m_t)`` for ``j <= t`` (0 above), and ``exp(F_t + m0 - m_t)``, the entering state's.

    ``F`` is the cumulative log forget gate: every entry is at most 1 since
    ``m_t`` is at least each of these exponents.
    """
    cumulative = F.logsigmoid(fgate).cumsum(-1)
    seq = igate.shape[-1]
    exponent = cumulative[..., :, None] - cumulative[..., None, :] + igate[..., None, :] - m[..., :, None]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=igate.device).tril()
    weights = torch.where(causal, exponent, -math.inf).exp()
    start = 0.0 if m0 is None else m0[..., 0, None].to(igate.dtype)
    entering = (cumulative + start - m).exp()
    return weights, entering


def mlstm_states(
    key: torch.Tensor,
    value: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    initial: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    positions: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(C, n, m) after the tokens ``positions`` (sorted, distinct): [batch, rows, heads, key_dim, value_dim], [..,
    key_dim], [.., 1].

    Exact, block by block of ``BLOCK`` tokens: inside a block ``C_t = sum_j
    exp(F_t - F_j + i_j - m_t) k_j v_j^T`` over its tokens ``j <= t``, plus
    the memory the block starts from decayed by ``exp(F_t - F_s + m_s - m_t)``,
    one matrix product over the block's outer products with that memory as
    one more row; the normalizer the same with ``k_j`` alone.
    """
    # the layer hands the backend transposed views: each block reads its tokens from contiguous rows
    key, value, igate, fgate = (x.to(dtype).contiguous() for x in (key, value, igate, fgate))
    batch, heads, seq, key_dim = key.shape
    value_dim = value.shape[-1]
    if initial is None:
        memory = key.new_zeros(batch, heads, 1, key_dim * value_dim)
        normalizer = key.new_zeros(batch, heads, 1, key_dim)
        m0 = None
    else:
        m0 = initial[2].to(dtype)
        memory = initial[0].to(dtype).reshape(batch, heads, 1, key_dim * value_dim)
        normalizer = initial[1].to(dtype).reshape(batch, heads, 1, key_dim)
    m = stabilizers(igate, fgate, m0)
    cumulative = F.logsigmoid(fgate).cumsum(-1)
    # the block's start: F and m before its first token (F = 0 and m = m0 before the call's first)
    before_f = key.new_zeros(batch, heads)
    before_m = key.new_zeros(batch, heads) if m0 is None else m0[..., 0]
    positions = positions.to(key.device)
    # heads first, so that each block's rows land as one contiguous copy per head
    memories = key.new_empty(batch, heads, len(positions), key_dim * value_dim)
    normalizers = key.new_empty(batch, heads, len(positions), key_dim)
    for start in range(0, seq, BLOCK):
        stop = min(start + BLOCK, seq)
        inside = ((positions >= start) & (positions < stop)).nonzero()[:, 0]
        last = stop < seq and not bool((positions[inside] == stop - 1).any())
        rows = torch.cat([positions[inside], positions.new_tensor([stop - 1] if last else [])])
        if not len(rows):
            continue
        exponent = cumulative[..., rows, None] - cumulative[..., None, start:stop] + igate[..., None, start:stop]
        causal = rows[:, None] >= torch.arange(start, stop, device=key.device)
        exponent = torch.where(causal, exponent - m[..., rows, None], -math.inf)
        carried = cumulative[..., rows] - before_f[..., None] + before_m[..., None] - m[..., rows]
        weights = torch.cat([carried[..., None], exponent], -1).exp()
        keys = key[..., start:stop, :]
        outer = (keys[..., None] * value[..., start:stop, None, :]).flatten(-2)
        block_memories = weights @ torch.cat([memory, outer], 2)
        block_normalizers = weights @ torch.cat([normalizer, keys], 2)
        memories[:, :, inside] = block_memories[:, :, : len(inside)]
        normalizers[:, :, inside] = block_normalizers[:, :, : len(inside)]
        memory, normalizer = block_memories[:, :, -1:], block_normalizers[:, :, -1:]
        before_f, before_m = cumulative[..., stop - 1], m[..., stop - 1]
    memories = memories.unflatten(-1, (key_dim, value_dim)).transpose(1, 2)
    return memories, normalizers.transpose(1, 2), m[..., positions].transpose(1, 2)[..., None]


def denominators(query: torch.Tensor, normalizer: torch.Tensor, stabilizer: torch.Tensor, eps: float) -> torch.Tensor:
    """``max(|q_t . n_t| / sqrt(key_dim), exp(-m_t)) + eps`` per row and head, [batch, heads, rows]; ``query`` [b, h, rows, d]."""
    scaled = query * query.shape[-1] ** -0.5
    dot = torch.einsum("bhtk,bthk->bht", scaled, normalizer)
    return torch.maximum(dot.abs(), torch.exp(-stabilizer[..., 0].transpose(1, 2))) + eps


def mlstm_mixing(
    query: torch.Tensor,
    key: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    initial: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    rows: torch.Tensor,
    heads: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact token mixing of the head outputs at ``rows`` and ``heads``, float32.

    Returns ``(M, D, A)``: ``M`` [batch, heads, rows, seq] with
    ``M[t, j] = w[t, j] (q_t . k_j) / sqrt(d) / D_t``; ``D`` [batch, heads, rows],
    the denominators, which depend on the queries, keys and gates but not on
    the values; and ``A`` [batch, heads, rows, key_dim], what the rows read of
    the entering memory (``q_t exp(F_t + m0 - m_t) / sqrt(d) / D_t``; zero
    without one). ``h_t = sum_j M[t, j] v_j + A_t C_0``.
    """
    query, key, igate, fgate = (x.float()[:, heads] for x in (query, key, igate, fgate))
    c0, n0, m0 = (None, None, None) if initial is None else (s.float()[:, heads] for s in initial)
    m = stabilizers(igate, fgate, m0)
    weights, entering = _weights(igate, fgate, m0, m)
    rows = rows.to(weights.device)
    scaled = query[:, :, rows] * query.shape[-1] ** -0.5
    normalizer = torch.einsum("bhtj,bhjk->bthk", weights[..., rows, :], key)
    if n0 is not None:
        normalizer = normalizer + entering[..., rows].transpose(1, 2)[..., None] * n0[:, None]
    denominator = denominators(query[:, :, rows], normalizer, m[..., rows].transpose(1, 2)[..., None], eps)
    matrix = weights[..., rows, :] * torch.einsum("bhtk,bhjk->bhtj", scaled, key) / denominator[..., None]
    reads = scaled * (entering[..., rows] / denominator)[..., None]
    return matrix, denominator, reads


def mlstm_readout(
    query: torch.Tensor, memory: torch.Tensor, denominator: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """``q_t memory / sqrt(d) / D_t`` at ``rows``: [batch, rows, heads, value_dim]; ``memory`` [batch, heads, key_dim, value_dim]."""
    scaled = query.float()[:, :, rows.to(query.device)] * query.shape[-1] ** -0.5
    return (torch.einsum("bhtk,bhkv->bhtv", scaled, memory.float()) / denominator[..., None]).transpose(1, 2)
