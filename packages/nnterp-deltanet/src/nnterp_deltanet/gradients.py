"""The gradient with respect to a delta rule's state after each token: its recurrence run backwards.

Per head, the state after token ``t`` is ``S_t = A_t S_{t-1} + beta_t k_t v_t^T`` with the
transition ``A_t = (I - beta_t k_t k_t^T) D_t`` (``D_t`` the decay ``exp(g_t)``, a scalar, or one
per key channel on KDA), and the head output reads it, ``o_t = S_t^T q_t``. With the gates fixed,
``S_t`` reaches a metric through ``o_t`` and through ``S_{t+1}``, so its gradient ``L_t`` obeys::

    L_t = q_t (dM/do_t)^T + A_{t+1}^T L_{t+1} = q_t (dM/do_t)^T + D_{t+1} (L_{t+1} - beta_{t+1} k_{t+1} (k_{t+1}^T L_{t+1}))

from the last token, where ``L`` starts at zero. ``q`` and ``k`` are the kernel's own: l2-normalized
where it normalizes, and ``q`` scaled by ``1/sqrt(key_dim)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from nnterp.recurrence import state_patch_estimates

from .mixing import reading_queries
from .trajectory import _DeltaRule, _pairwise_decay


@torch.no_grad()
def delta_rule_state_gradients(
    query: Tensor, key: Tensor, g: Tensor, beta: Tensor, head_output_gradients: Tensor, *, use_qk_l2norm: bool
) -> Tensor:
    """The gradient with respect to the state after each token, ``[batch, seq, heads, key_dim, value_dim]``, float32.

    ``query``, ``key``, ``g`` and ``beta`` are the delta-rule kernel's arguments, as ``delta_rule_states``
    takes them (queries and keys repeated to the value heads as the kernel repeats them);
    ``head_output_gradients`` is the gradient with respect to its output, ``[batch, seq, heads, value_dim]``.
    One step per token, backwards, each a few products of one state's size; no gradient flows through it.
    """
    batch, seq, heads, value_dim = head_output_gradients.shape
    result = torch.empty(batch, seq, heads, key.shape[-1], value_dim, device=head_output_gradients.device)
    adjoint = _adjoint(query, key, g, beta, head_output_gradients, use_qk_l2norm)
    for t, gradient in zip(reversed(range(seq)), adjoint, strict=True):
        result[:, t] = gradient
    return result


class DeltaRuleRun(NamedTuple):
    """One run of a delta-rule kernel call: its arguments, as ``delta_rule_states`` takes them."""

    query: Tensor
    key: Tensor
    value: Tensor
    g: Tensor
    beta: Tensor
    #: the state the call starts from, ``[batch, heads, key_dim, value_dim]``
    entering: Tensor


@torch.no_grad()
def delta_rule_state_patch_estimates(
    clean: DeltaRuleRun,
    corrupt: DeltaRuleRun,
    head_output_gradients: Tensor,
    *,
    use_qk_l2norm: bool,
    chunk_size: int = 64,
) -> Tensor:
    """``(corrupt S_t - clean S_t) . L_t`` per token and head, ``[batch, seq, heads]`` float32, ``L_t`` the clean run's
    adjoint from ``head_output_gradients``.

    With one decay per head, in chunks without forming a state per token (``_paired_estimates``). With one
    per key channel (KDA) the decays between a write, a token and a later read do not factor into chunk
    products; there the product runs one chunk of each run's states at a time
    (``nnterp.recurrence.state_patch_estimates``) beside the adjoint stepped back token by token.
    """
    runs = tuple(
        _DeltaRule(run.key, run.value, run.g, run.beta, run.entering, use_qk_l2norm, chunk_size, torch.float32)
        for run in (clean, corrupt)
    )
    if clean.g.dim() == 3:
        return _paired_estimates(*runs, clean.query, head_output_gradients)
    adjoint = _adjoint(clean.query, clean.key, clean.g, clean.beta, head_output_gradients, use_qk_l2norm)
    return state_patch_estimates(*runs, adjoint)


def _paired_estimates(clean: _DeltaRule, corrupt: _DeltaRule, query: Tensor, head_output_gradients: Tensor) -> Tensor:
    """The estimate with one decay per head, a few products per chunk: no state per token, no step per token.

    Within a chunk, with ``G`` a run's cumulative log decay from the chunk's start, ``S_0`` the state
    it starts from and ``delta`` its corrections (``trajectory``), ``S_t = exp(G_t) S_0 + sum_{j <=
    t} exp(G_t - G_j) k_j delta_j^T``. The adjoint unrolls the same way backwards: with ``H`` the
    clean run's ``G``, ``R`` the adjoint the next chunk hands back (decayed to this chunk's last
    token) and ``eta_r = beta_r k_r^T L_r`` its own corrections::

        L_t = exp(H_last - H_t) R + sum_{r >= t} exp(H_r - H_t) q_r g_r^T - sum_{r > t} exp(H_r - H_t) k_r eta_r^T

    ``eta`` solves a unit upper triangular system per chunk, affine in ``R`` (the delta rule's UT
    transform, run backwards), so one solve serves every chunk and a loop over chunks carries ``R``.
    ``S_t . L_t`` is then a sum over pairs ``j <= t <= r`` of ``(k_j . q_r)(delta_j . g_r)`` and
    ``(k_j . k_r)(delta_j . eta_r)`` times those decays, a ``[chunk, chunk]`` matrix per head, plus
    the pairs that reach the chunk's start state or ``R``. Every exponent is a later cumulative log
    decay less an earlier one.
    """
    heads, value_dim = clean.shape[1], clean.shape[3]
    seq = clean.seq_len

    def chunked(tensor: Tensor) -> Tensor:
        """[batch, seq, heads, n] as [batch, heads, chunks, chunk, n], float32."""
        return clean.in_chunks(tensor.float().transpose(1, 2), 2)

    starts, writes = clean.chunk_starts()  # lays out the clean run: its keys, gates and betas
    keys, held = clean.keys, clean.gates.squeeze(-1).cumsum(-1)  # [batch, heads, chunks, chunk, (key_dim)]
    reading = chunked(reading_queries(query.repeat_interleave(heads // query.shape[2], dim=2), clean.use_qk_l2norm))
    gradients = chunked(head_output_gradients)
    # later[i, r] = exp(H_r - H_i) for r >= i, and strictly for r > i
    after = torch.ones(clean.chunk_size, clean.chunk_size, dtype=torch.bool, device=keys.device).triu(1)
    later = _pairwise_decay(held.unsqueeze(-1), held.unsqueeze(-1), after).squeeze(-1).transpose(-1, -2)
    strictly_later = later.masked_fill(torch.eye(clean.chunk_size, dtype=torch.bool, device=keys.device), 0.0)
    to_end, since_start = (held[..., -1:] - held).exp(), held.exp()

    # the adjoint's corrections, eta = from_zero + from_leaving @ R, every chunk in one solve
    key_beta = keys * clean.betas
    solved = torch.linalg.solve_triangular(
        (key_beta @ keys.transpose(-1, -2)) * strictly_later,
        torch.cat([((key_beta @ reading.transpose(-1, -2)) * later) @ gradients, key_beta * to_end[..., None]], -1),
        upper=True,
        unitriangular=True,
    )
    from_zero, from_leaving = solved[..., :value_dim], solved[..., value_dim:]
    read_back = reading.transpose(-1, -2) @ (since_start[..., None] * gradients)  # [batch, heads, chunks, key, value]
    leaving, corrections = torch.zeros_like(read_back), torch.empty_like(gradients)
    for chunk in reversed(range(read_back.shape[2])):
        corrections[:, :, chunk] = from_zero[:, :, chunk] + from_leaving[:, :, chunk] @ leaving[:, :, chunk]
        if chunk:
            leaving[:, :, chunk - 1] = (
                read_back[:, :, chunk]
                - keys[:, :, chunk].transpose(-1, -2) @ (since_start[:, :, chunk, :, None] * corrections[:, :, chunk])
                + since_start[:, :, chunk, -1, None, None] * leaving[:, :, chunk]
            )

    def paired(run: _DeltaRule, starts: Tensor, writes: list[Tensor]) -> Tensor:
        """``S_t . L_t`` of one run, ``[batch, heads, chunks, chunk]``."""
        # heads first, contiguous: each product with the start states would copy a transposed view again
        starts, written, kept = (
            starts.transpose(1, 2).contiguous(),
            torch.stack(writes, dim=2),
            run.gates.squeeze(-1).cumsum(-1),
        )
        # earlier[t, j] = exp(G_t - G_j) for j <= t
        earlier = _pairwise_decay(kept.unsqueeze(-1), kept.unsqueeze(-1), after).squeeze(-1)
        read_pairs = (reading @ run.keys.transpose(-1, -2)) * (gradients @ written.transpose(-1, -2))  # [r, j]
        removed_pairs = (keys @ run.keys.transpose(-1, -2)) * (corrections @ written.transpose(-1, -2))
        within = ((later @ read_pairs - strictly_later @ removed_pairs) * earlier).sum(-1)
        start_read = ((reading @ starts) * gradients).sum(-1)  # [r]
        start_removed = ((keys @ starts) * corrections).sum(-1)
        written_leaving = ((run.keys @ leaving) * written).sum(-1)  # [j]
        both = (starts * leaving).sum((-2, -1)).unsqueeze(-1)
        kept_since_start = kept.exp()
        return (
            within
            + kept_since_start
            * (later @ start_read.unsqueeze(-1) - strictly_later @ start_removed.unsqueeze(-1))[..., 0]
            + to_end * (earlier @ written_leaving.unsqueeze(-1))[..., 0]
            + kept_since_start * to_end * both
        )

    clean_products = paired(clean, starts, writes)
    estimates = paired(corrupt, *corrupt.chunk_starts()).sub_(clean_products)
    return estimates.flatten(2, 3)[:, :, :seq].transpose(1, 2)


def _adjoint(
    query: Tensor, key: Tensor, g: Tensor, beta: Tensor, head_output_gradients: Tensor, use_qk_l2norm: bool
) -> Iterator[Tensor]:
    """``L_t`` from the last token back, ``[batch, heads, key_dim, value_dim]`` float32, each written over two steps on."""
    heads = head_output_gradients.shape[2]
    reading = reading_queries(query.repeat_interleave(heads // query.shape[2], dim=2), use_qk_l2norm)
    key = key.repeat_interleave(heads // key.shape[2], dim=2).float()
    if use_qk_l2norm:
        key = key * torch.rsqrt((key * key).sum(-1, keepdim=True) + 1e-6)
    # [batch, seq, heads, 1, 1]: one decay per head, or [batch, seq, heads, key_dim, 1]: one per state row
    decay = g.float().exp()
    decay = decay.unsqueeze(-1) if g.dim() == 4 else decay[..., None, None]
    key_beta = key * beta.float()[..., None]
    gradients = head_output_gradients.float()
    batch, seq = gradients.shape[:2]
    # two slots, L_t and L_{t+1}, in turn: no state-sized temporaries per token
    running, later = (
        torch.empty(batch, heads, key.shape[-1], gradients.shape[-1], device=gradients.device) for _ in range(2)
    )
    for t in reversed(range(seq)):
        if t + 1 < seq:
            retrieved = torch.einsum("bhk,bhkv->bhv", key[:, t + 1], later)
            torch.mul(key_beta[:, t + 1, :, :, None], retrieved[:, :, None, :], out=running)
            running.sub_(later).neg_().mul_(decay[:, t + 1])
            running.addcmul_(reading[:, t, :, :, None], gradients[:, t, :, None, :])
        else:
            torch.mul(reading[:, t, :, :, None], gradients[:, t, :, None, :], out=running)
        yield running
        running, later = later, running
