"""The gradient through a Mamba-1 selective scan: its recurrence run backwards, from the scan's arguments.

transformers' pure-torch ``mamba_selective_scan`` reads token ``t``'s slice of its decays and writes
(``[batch, channels, seq, state_dim]``) once per step of its loop. Autograd records each read as its
own slice, and the backward of a slice is a zero tensor of the whole, so the backward through the
loop writes ``seq`` whole-sized tensors per argument: quadratic in the prompt, about 13 times a
forward at 256 tokens. The scan's adjoint needs none of that. Per channel c and state dimension n,
with ``a_t = exp(dt_t A)`` and ``w_t = dt_t x_t B_t``::

    h_t = a_t h_{t-1} + w_t,        y_t = C_t . h_t + D x_t

so the gradient ``G_t`` of a metric with respect to ``h_t`` obeys, from the last token (``G`` past
it is zero)::

    G_t = C_t (dM/dy_t) + a_{t+1} G_{t+1}

and ``a_t`` and ``w_t`` reach the metric only through ``h_t``: their gradients are ``G_t h_{t-1}``
and ``G_t``, and ``C_t``'s is ``sum_c h_t dM/dy_t``. ``SelectiveScanAdjoint`` is that backward:
one step per token over a ``[batch, channels, state_dim]`` state, then autograd over the few
elementwise operations that make ``a``, ``w`` and ``y`` from the arguments.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from .trajectory import step_sizes, tokens_first


@torch.no_grad()
def selective_scan_state_gradients(log_decay: Tensor, C: Tensor, head_output_gradients: Tensor) -> Tensor:
    """The gradient with respect to the state after each token, ``[batch, seq, channels, state_dim]``, float32.

    ``log_decay`` is ``dt_t A`` per token, channel and state dimension, ``[batch, seq, channels,
    state_dim]``; ``C`` the scan's ``[batch, state_dim, seq]``; ``head_output_gradients`` the
    gradient with respect to its output ``y``, ``[batch, channels, seq]``. One step per token,
    backwards, each written in place into its slot; every token's decays and slot are one
    contiguous slice, whatever ``log_decay``'s layout.
    """
    return _adjoint(
        torch.exp(log_decay.float(), out=torch.empty(log_decay.shape, device=log_decay.device)),
        C,
        head_output_gradients,
    )


class SelectiveScanRun(NamedTuple):
    """What the state patch estimate needs of one run of a prompt's scan call (which starts from zeros), float32."""

    #: ``dt`` after its bias and softplus, ``[batch, channels, seq]``
    step: Tensor
    #: ``[batch, channels, seq]``
    x: Tensor
    #: the keys, ``[batch, state_dim, seq]``
    B: Tensor
    #: the queries, ``[batch, state_dim, seq]``
    C: Tensor
    #: ``[channels, state_dim]``
    A: Tensor


@torch.no_grad()
def selective_scan_state_patch_estimates(
    clean: SelectiveScanRun, corrupt: SelectiveScanRun, head_output_gradients: Tensor
) -> Tensor:
    """``(corrupt h_t - clean h_t) . G_t`` per token and channel, ``[batch, seq, channels]`` float32, ``G_t`` the clean
    run's adjoint from ``head_output_gradients`` ``[batch, seq, channels]``.

    Both runs' states are formed by one loop (``_states``), so where the runs agree the estimate is exactly zero.
    """
    decays = _decays(clean.step, clean.A)
    adjoint = _adjoint(decays, clean.C, head_output_gradients.transpose(1, 2))
    return _patch_estimates(corrupt, _states(decays, clean.step * clean.x, clean.B), adjoint)


def _patch_estimates(corrupt: SelectiveScanRun, states: Tensor, adjoint: Tensor) -> Tensor:
    """``(corrupt h_t - h_t) . G_t`` per token and channel, from this run's ``states`` and their ``adjoint``."""
    patch = _states(_decays(corrupt.step, corrupt.A), corrupt.step * corrupt.x, corrupt.B).sub_(states)
    return patch.mul_(adjoint).sum(-1)


def _decays(step: Tensor, A: Tensor) -> Tensor:
    """``exp(dt_t A)``, ``[batch, seq, channels, state_dim]`` float32, from the steps ``[batch, channels, seq]``."""
    batch, channels, seq = step.shape
    result = torch.empty(batch, seq, channels, A.shape[1], device=step.device)
    return torch.mul(tokens_first(step)[..., None], A.float(), out=result).exp_()


def _states(decays: Tensor, written: Tensor, keys: Tensor) -> Tensor:
    """The state after each token from zeros, ``[batch, seq, channels, state_dim]`` float32, one step per token
    over the decays ``exp(dt_t A)`` the adjoint reads too: ``written`` is ``dt x`` ``[batch, channels, seq]``, ``keys``
    the scan's ``B`` ``[batch, state_dim, seq]``."""
    result = torch.empty(decays.shape, device=decays.device)
    torch.mul(tokens_first(written)[..., None], tokens_first(keys)[:, :, None], out=result)  # each token's write
    states, kept = result.unbind(1), decays.unbind(1)
    for t in range(1, len(states)):
        states[t].addcmul_(states[t - 1], kept[t])
    return result


def _adjoint(decays: Tensor, C: Tensor, head_output_gradients: Tensor) -> Tensor:
    """``selective_scan_state_gradients`` from the decays ``exp(dt_t A)`` themselves."""
    result = torch.empty(decays.shape, device=decays.device)
    torch.mul(tokens_first(head_output_gradients)[..., None], tokens_first(C)[:, :, None], out=result)  # readouts
    adjoint, kept = result.unbind(1), decays.unbind(1)
    for t in reversed(range(len(adjoint) - 1)):
        adjoint[t].addcmul_(adjoint[t + 1], kept[t + 1])
    return result


class SelectiveScanAdjoint(torch.autograd.Function):
    """Zeros in the forward; in the backward, the gradient of the scan's ``y`` with respect to its arguments.

    ``apply(x, dt, A, B, C, D, dt_bias, softplus, corrupt, probe)``
    takes the prompt kernel's arguments as it takes them (channel-first,
    ``dt`` before its bias); the kernel starts from zeros, and so does its
    adjoint. Added to the kernel's own ``y`` detached, it leaves the value as
    the kernel computed it and routes the gradient through the adjoint. Tokens
    come first in what it computes, so each token's slice is contiguous.

    ``corrupt`` (a ``SelectiveScanRun``, or ``None``) is another run of the
    call, and ``probe`` zeros ``[batch, seq, channels]``: the backward, which
    forms this run's states and their adjoint anyway, gives ``probe`` the
    gradient ``(corrupt h_t - h_t) . G_t`` per token and channel, the
    first-order effect of patching that run's states in
    (``selective_scan_state_patch_estimates``).
    """

    @staticmethod
    def forward(ctx: Any, x, dt, A, B, C, D, dt_bias, softplus, corrupt, probe) -> Tensor:
        ctx.save_for_backward(x, dt, A, B, C, D, dt_bias)
        ctx.softplus, ctx.corrupt = softplus, corrupt
        return torch.zeros_like(x)

    @staticmethod
    def backward(ctx: Any, output_gradients: Tensor) -> tuple[Tensor | None, ...]:
        x, dt, A, B, C, D, dt_bias = arguments = ctx.saved_tensors
        needed = dict(zip(("x", "dt", "A", "B", "C", "D", "dt_bias"), ctx.needs_input_grad, strict=False))
        with torch.enable_grad():
            # a frozen model's parameters (attribution's run) take no gradient: A's, D's and the bias's go uncomputed
            leaves = [dt.detach().requires_grad_(), dt_bias.detach().requires_grad_() if needed["dt_bias"] else None]
            step = step_sizes(leaves[0], dt_bias if leaves[1] is None else leaves[1], ctx.softplus)
        rate, written = A.float(), step.detach() * x.float()  # [channels, state_dim], [batch, channels, seq]
        keys, gradients = B.float(), output_gradients.float()
        decays = _decays(step.detach(), rate)  # [batch, seq, channels, state_dim]
        states, adjoint = _states(decays, written, keys), _adjoint(decays, C, gradients)
        of_probe = None if ctx.corrupt is None else _patch_estimates(ctx.corrupt, states, adjoint)
        # h_t = exp(log_decay_t) h_{t-1} + (dt x)_t B_t: the gradient of log_decay_t is the decayed state's, the
        # state before the first token zero; written over the decays, which are read no more
        of_log_decay = decays
        of_log_decay[:, 0] = 0
        of_log_decay[:, 1:].mul_(states[:, :-1])
        of_log_decay.mul_(adjoint)
        of_written = torch.einsum("btcn,bnt->bct", adjoint, keys)
        of_step = torch.einsum("btcn,cn->bct", of_log_decay, rate) + of_written * x.float()
        # y = C . h + D x
        of_x = of_written * step.detach() + (0 if D is None else gradients * D.float()[:, None])
        of_A = torch.einsum("btcn,bct->cn", of_log_decay, step.detach()) if needed["A"] else None
        of_B = torch.einsum("btcn,bct->bnt", adjoint, written)
        of_C = torch.einsum("btcn,bct->bnt", states, gradients)
        of_D = (gradients * x.float()).sum((0, 2)) if needed["D"] else None
        wanted = [leaf for leaf in leaves if leaf is not None]
        found = iter(torch.autograd.grad(step, wanted, of_step))
        of_dt, of_dt_bias = (None if leaf is None else next(found) for leaf in leaves)
        computed = (of_x, of_dt, of_A, of_B, of_C, of_D, of_dt_bias)
        return (
            *(
                None if value is None else value.to(argument.dtype)
                for value, argument in zip(computed, arguments, strict=True)
            ),
            None,
            None,
            of_probe,
        )
