"""The lightning-attention recurrence in plain torch: states, token mixing and readout from served q, k, v and slopes.

Per head, with a fixed rate ``s`` (the module's ``slope_rate``)::

    S_t = exp(-s) S_{t-1} + k_t^T v_t
    o_t = q_t S_t

``S`` is [key_dim, value_dim] per head; a prompt starts from zeros, a call over a cache from the cached state.
MiniMax's forward evaluates this in blocks (a decay mask inside a block, the state carried between blocks) or
token by token over a cache; both equal the recurrence above. Everything here works in float32 or wider.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: Tokens per chunk when states are computed: a chunk is one batched product, chunks run one after the other.
CHUNK = 64


def decay_powers(slopes: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """``exp(-s * d)`` per head for every distance: [heads, *distances.shape]; zero where ``d`` is negative."""
    rates = slopes.reshape(-1, *([1] * distances.dim()))
    powers = torch.exp(-rates * distances.clamp(min=0).to(rates.dtype))
    return powers.masked_fill(distances < 0, 0)


def lightning_states(
    keys: torch.Tensor,
    values: torch.Tensor,
    slopes: torch.Tensor,
    state: torch.Tensor | None,
    positions: torch.Tensor,
    dtype: torch.dtype,
    memory: Callable[[tuple[int, ...]], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The state after each of ``positions`` (sorted), [batch, len(positions), heads, key_dim, value_dim].

    ``keys`` [batch, seq, heads, key_dim] and ``values`` [batch, seq, heads, value_dim] as served; ``slopes``
    [heads]; ``state`` [batch, heads, key_dim, value_dim], the state before the first token, or ``None`` for zeros.
    Where most positions are asked for, every state is scanned into ``memory(shape)`` (uninitialized, of ``dtype``
    on the keys' device; fresh memory without ``memory``); otherwise they are computed chunk by chunk: inside a chunk every state at once from the decay matrix,
    the chunk's last state carried.
    """
    batch, seq, heads, key_dim = keys.shape
    value_dim = values.shape[-1]
    keys, values, slopes = keys.to(dtype), values.to(dtype), slopes.to(dtype)
    if len(positions) * 4 >= seq:
        shape = (batch, seq, heads, key_dim, value_dim)
        states = _scanned(keys, values, slopes, state, keys.new_empty(shape) if memory is None else memory(shape))
        every = len(positions) == seq and bool((positions.cpu() == torch.arange(seq)).all())
        # every state in order is the scan's own tensor: indexing would copy seq x heads x key_dim x value_dim floats
        return states if every else states[:, positions.to(keys.device)]
    carried = keys.new_zeros(batch, heads, key_dim, value_dim) if state is None else state.to(dtype)
    out = keys.new_empty(batch, len(positions), heads, key_dim, value_dim)
    positions = positions.tolist()
    needed = 0
    for start in range(0, seq, CHUNK):
        if needed == len(positions):
            break
        stop = min(start + CHUNK, seq)
        index = torch.arange(stop - start, device=keys.device)
        mask = decay_powers(slopes, index[:, None] - index[None, :])  # [heads, i, j]
        entering = decay_powers(slopes, index + 1)  # [heads, i]
        wanted = [p - start for p in positions[needed:] if p < stop]
        if wanted:
            rows = torch.tensor(wanted, device=keys.device)
            chunk = torch.einsum("hij,bjhk,bjhv->bihkv", mask[:, rows], keys[:, start:stop], values[:, start:stop])
            chunk += entering[:, rows].T[None, :, :, None, None] * carried[:, None]
            out[:, needed : needed + len(wanted)] = chunk
            needed += len(wanted)
        last = torch.einsum("hj,bjhk,bjhv->bhkv", mask[:, -1], keys[:, start:stop], values[:, start:stop])
        carried = entering[:, -1][None, :, None, None] * carried + last
    return out


def _scanned(
    keys: torch.Tensor, values: torch.Tensor, slopes: torch.Tensor, state: torch.Tensor | None, out: torch.Tensor
) -> torch.Tensor:
    """Every state, token by token, in place in ``out``: the writes ``k_t^T v_t`` first, then each decays its
    predecessor in.

    Three passes over the result's memory (the writes, and each state read and updated once), which is what
    ``state_trajectory`` costs beyond allocating it; a fused multiply-add per token, with no temporary.
    """
    states = torch.mul(keys[..., :, None], values[..., None, :], out=out)
    keep = torch.exp(-slopes)[None, :, None, None].expand(states.shape[0], -1, *states.shape[-2:])
    if state is not None:
        states[:, 0].addcmul_(keep, state.to(states))
    for t in range(1, states.shape[1]):
        states[:, t].addcmul_(states[:, t - 1], keep)
    return states


def lightning_mixing(
    queries: torch.Tensor,
    keys: torch.Tensor,
    slopes: torch.Tensor,
    state: torch.Tensor | None,
    rows: torch.Tensor,
    heads: torch.Tensor,
    value_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token mixing at ``rows`` and ``heads``: (matrix [batch, heads, rows, seq], offset [batch, rows, heads, value_dim]).

    ``M[b, h, t, j] = exp(-s_h (t - j)) q_t . k_j`` for ``j <= t``: the head output at ``t`` is
    ``sum_j M[t, j] v_j`` plus the readout of the entering state, ``exp(-s_h (t + 1)) q_t S_0`` (the offset).
    """
    queries, keys = queries[:, rows][:, :, heads].float(), keys[:, :, heads].float()
    slopes = slopes[heads].float()
    seq = keys.shape[1]
    distance = rows[:, None].to(keys.device) - torch.arange(seq, device=keys.device)[None, :]
    scores = torch.einsum("bihk,bjhk->bhij", queries, keys)
    matrix = scores * decay_powers(slopes, distance)[None]
    if state is None:
        offset = queries.new_zeros(*queries.shape[:3], value_dim)
        return matrix, offset
    offset = lightning_readout(queries, state[:, heads].float(), slopes, rows.to(keys.device) + 1)
    return matrix, offset


def lightning_readout(
    queries: torch.Tensor, state: torch.Tensor, slopes: torch.Tensor, distances: torch.Tensor
) -> torch.Tensor:
    """``exp(-s d) q_t S`` per row: each row's query reading ``state`` decayed over ``distances`` tokens.

    ``queries`` [batch, rows, heads, key_dim], ``state`` [batch, heads, key_dim, value_dim], ``distances`` [rows];
    returns [batch, rows, heads, value_dim].
    """
    decay = decay_powers(slopes.float(), distances.to(queries.device)).T  # [rows, heads]
    return torch.einsum("bihk,bhkv->bihv", queries.float(), state.float()) * decay[None, :, :, None]
