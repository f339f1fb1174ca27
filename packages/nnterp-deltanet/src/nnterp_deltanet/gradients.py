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
from .trajectory import _DeltaRule


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

    One chunk of each run's states at a time (``nnterp.recurrence.state_patch_estimates``): the
    product over both trajectories and the adjoint, three ``[seq, heads, key_dim, value_dim]``
    tensors, would hold a state-sized slot per token for each, every page of them touched once.
    """
    runs = (
        _DeltaRule(run.key, run.value, run.g, run.beta, run.entering, use_qk_l2norm, chunk_size, torch.float32)
        for run in (clean, corrupt)
    )
    adjoint = _adjoint(clean.query, clean.key, clean.g, clean.beta, head_output_gradients, use_qk_l2norm)
    return state_patch_estimates(*runs, adjoint)


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
