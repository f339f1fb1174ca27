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

The UT solve runs for every chunk at once. A loop over chunks (not tokens) then carries the
state, a few operations per chunk: the chunk's corrections from its start state, and its end
state (the sum above at its last position, one matrix product), the next chunk's start. With the
start states and the corrections known, the sum above is a rank-one update per token,
``S_t = exp(g_t) * S_{t-1} + k_t delta_t^T``, through which every asked chunk steps at once: at
most a chunk's length of steps, whatever the call's length, each state copied into the result
once. ``nnterp.recurrence.ChunkedRecurrence`` runs the loop and the steps; ``_DeltaRule``
supplies this math. Every exponent is ``G_t - G_j`` with ``j <= t``, ``G_t`` or ``g_t``, so no
exp of a positive number is taken.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nnterp.positions import Advance, Positions, rank_one_steps
from nnterp.recurrence import ChunkedRecurrence


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
    key_heads, heads = key.shape[2], value.shape[-2]
    if heads % key_heads:
        raise ValueError(
            f"value has {heads} heads and key {key_heads}: the kernel repeats each key head over "
            f"{heads} // {key_heads} value heads, so the value heads must be a multiple of the key heads"
        )
    return _DeltaRule(key, value, g, beta, initial_state, use_qk_l2norm, chunk_size, dtype or query.dtype).states(
        positions
    )


class _DeltaRule(ChunkedRecurrence):
    """One delta-rule kernel call as a chunked recurrence: its state ``[batch, heads, key_dim, value_dim]``."""

    def __init__(
        self,
        key: Tensor,
        value: Tensor,
        g: Tensor,
        beta: Tensor,
        initial_state: Tensor | None,
        use_qk_l2norm: bool,
        chunk_size: int,
        dtype: torch.dtype,
    ) -> None:
        batch, seq_len, _, key_dim = key.shape
        heads, value_dim = value.shape[-2:]
        super().__init__(seq_len, (batch, heads, key_dim, value_dim), initial_state, chunk_size, dtype, value.device)
        self.key, self.value, self.g, self.beta = key, value, g, beta
        self.use_qk_l2norm = use_qk_l2norm

    def lay_out(self, end: int) -> None:
        """Keys and gates ``[batch, heads, chunks, chunk, ...]``, and each chunk's UT transform, solved for all at once."""
        heads, value_dim = self.shape[1], self.shape[3]
        key = self.key[:, :end].repeat_interleave(heads // self.key.shape[2], dim=2)
        key = key.transpose(1, 2).float()
        if self.use_qk_l2norm:
            key = key * torch.rsqrt((key * key).sum(-1, keepdim=True) + 1e-6)
        per_channel = self.g.dim() == 4
        # [batch, heads, seq, gates]: one gate per head, or one per key channel
        gate = self.g[:, :end].float().transpose(1, 2)
        gate = gate if per_channel else gate.unsqueeze(-1)
        beta = self.beta[:, :end].float().transpose(1, 2).unsqueeze(-1)
        value = self.value[:, :end].float().transpose(1, 2)
        # [batch, heads, chunks, chunk, ...]. Padding tokens have a zero key, beta and log decay: they
        # leave the state as it is.
        key, value, beta, gate = (self.in_chunks(tensor, 2) for tensor in (key, value, beta, gate))
        cumulative = gate.cumsum(dim=3)
        key_beta = key * beta
        later = torch.ones(self.chunk_size, self.chunk_size, dtype=torch.bool, device=key.device).triu(1)

        # The UT transform of every chunk in one triangular solve: its right side holds the chunk's
        # corrections from a zero start state, and the map from the start state to what they lose.
        solved = torch.linalg.solve_triangular(
            _ut_system(key, key_beta, cumulative, later),
            torch.cat([value * beta, key_beta * cumulative.exp()], dim=-1),
            upper=False,
            unitriangular=True,
        )
        self.from_zero, self.start_read = solved[..., :value_dim], solved[..., value_dim:]
        last = cumulative[:, :, :, -1:]  # [batch, heads, chunks, 1, gates]
        self.chunk_decay = last.exp().transpose(-1, -2)
        self.end_keys = (key * (last - cumulative).exp()).transpose(-1, -2)
        self.keys, self.gates, self.betas = key, gate, beta

    def writes(self, start: Tensor, chunk: int) -> Tensor:
        """The chunk's corrections ``delta = U - W S_0``, ``[batch, heads, chunk, value_dim]``."""
        return self.from_zero[:, :, chunk] - self.start_read[:, :, chunk] @ start

    def carry(self, start: Tensor, chunk: int, writes: Tensor) -> Tensor:
        """``S_end = exp(G_last) * S_0 + sum_j (exp(G_last - G_j) * k_j) delta_j^T``."""
        return self.chunk_decay[:, :, chunk] * start + self.end_keys[:, :, chunk] @ writes

    def steps(self, asked: Tensor, writes: list[Tensor]) -> Advance:
        """Each token decays the state by its gate and writes its key times its correction."""

        def per_token(tensor: Tensor) -> Tensor:  # [batch, heads, chunks, chunk, n] -> [batch, asked, chunk, heads, n]
            return tensor[:, :, asked].permute(0, 2, 3, 1, 4)

        return rank_one_steps(
            per_token(self.gates).exp().unsqueeze(-1),
            per_token(self.keys).unsqueeze(-1),
            torch.stack(writes, dim=1).transpose(2, 3).unsqueeze(-2),
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
