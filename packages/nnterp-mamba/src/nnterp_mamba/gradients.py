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

from typing import Any

import torch
from torch import Tensor

from .trajectory import selective_scan_states, step_sizes


@torch.no_grad()
def selective_scan_state_gradients(log_decay: Tensor, C: Tensor, head_output_gradients: Tensor) -> Tensor:
    """The gradient with respect to the state after each token, ``[batch, seq, channels, state_dim]``, float32.

    ``log_decay`` is ``dt_t A`` per channel, token and state dimension, ``[batch, channels, seq,
    state_dim]``; ``C`` the scan's ``[batch, state_dim, seq]``; ``head_output_gradients`` the
    gradient with respect to its output ``y``, ``[batch, channels, seq]``. One step per token,
    backwards, each written in place into its slot.
    """
    batch, channels, seq = head_output_gradients.shape
    reading, gradients = C.float(), head_output_gradients.float()
    result = torch.empty(batch, seq, channels, C.shape[1], device=gradients.device)
    for t in reversed(range(seq)):
        running = result[:, t]
        torch.mul(reading[:, None, :, t], gradients[:, :, t, None], out=running)
        if t + 1 < seq:
            running.addcmul_(result[:, t + 1], log_decay[:, :, t + 1].exp())
    return result


class SelectiveScanAdjoint(torch.autograd.Function):
    """Zeros in the forward; in the backward, the gradient of the scan's ``y`` with respect to its arguments.

    ``apply(x, dt, A, B, C, D, dt_bias, softplus)`` takes the prompt
    kernel's arguments as it takes them (channel-first, ``dt`` before its
    bias); the kernel starts from zeros, and so does its adjoint. Added to the
    kernel's own ``y`` detached, it leaves the value as the kernel computed it
    and routes the gradient through the adjoint.
    """

    @staticmethod
    def forward(ctx: Any, x, dt, A, B, C, D, dt_bias, softplus) -> Tensor:
        ctx.save_for_backward(x, dt, A, B, C, D, dt_bias)
        ctx.softplus = softplus
        return torch.zeros_like(x)

    @staticmethod
    def backward(ctx: Any, output_gradients: Tensor) -> tuple[Tensor | None, ...]:
        arguments = ctx.saved_tensors
        x, dt, A, B, C, _, dt_bias = arguments
        states = selective_scan_states(x, dt, A, B, dt_bias=dt_bias, softplus=ctx.softplus, dtype=torch.float32)
        states = states.transpose(1, 2)  # [batch, channels, seq, state_dim]
        before = torch.nn.functional.pad(states[:, :, :-1], (0, 0, 1, 0))
        leaves = [None if tensor is None else tensor.detach().requires_grad_() for tensor in arguments]
        x, dt, A, B, C, D, dt_bias = leaves
        with torch.enable_grad():
            step = step_sizes(dt, dt_bias, ctx.softplus)  # [batch, channels, seq]
            log_decay = step[..., None] * A.float()[:, None, :]
            adjoint = selective_scan_state_gradients(log_decay.detach(), C, output_gradients).transpose(1, 2)
            written = (step * x.float())[..., None] * B.float().transpose(1, 2)[:, None]
            # y = C . h + D x: the state's own readout, with h held at its value
            readout = torch.einsum("bctn,bnt->bct", states, C.float())
            if D is not None:
                readout = readout + D.float()[:, None] * x.float()
            surrogate = (
                (log_decay.exp() * adjoint * before).sum()
                + (written * adjoint).sum()
                + (readout * output_gradients.float()).sum()
            )
        wanted = [tensor for tensor in leaves if tensor is not None]
        found = iter(torch.autograd.grad(surrogate, wanted, allow_unused=True))
        gradients = [None if tensor is None else next(found) for tensor in leaves]
        return (*gradients, None)
