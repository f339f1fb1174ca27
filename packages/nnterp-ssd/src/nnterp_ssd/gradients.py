"""The gradient with respect to a Mamba-2 scan's state after each token: its recurrence run backwards.

Per head, the state after token ``t`` (key side first, ``[state_dim, head_dim]``) is
``h_t = exp(dt_t A) h_{t-1} + B_t (dt_t x_t)^T`` and the head output reads it, ``y_t = h_t^T C_t +
D x_t``, with ``B`` and ``C`` shared by the heads of a group. With the gates fixed, ``h_t`` reaches a
metric through ``y_t`` and ``h_{t+1}``, so its gradient ``L_t`` obeys::

    L_t = C_t (dM/dy_t)^T + exp(dt_{t+1} A) L_{t+1}

from the last token, where ``L`` starts at zero: a scalar decay per head and token, as forwards.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def ssd_state_gradients(log_decay: Tensor, C: Tensor, head_output_gradients: Tensor) -> Tensor:
    """The gradient with respect to the state after each token, ``[batch, seq, heads, state_dim, head_dim]``, float32.

    ``log_decay`` is ``dt_t A`` per token and head, ``[batch, seq, heads]`` (the scan's step times its
    ``A``), ``C`` the scan's ``[batch, seq, groups, state_dim]``, ``head_output_gradients`` the gradient
    with respect to its output ``y``, ``[batch, seq, heads, head_dim]``. One step per token, backwards; no gradient
    flows through it.
    """
    batch, seq, heads, head_dim = head_output_gradients.shape
    reading = C.float().repeat_interleave(heads // C.shape[2], dim=2)  # each head its group's C
    decay, gradients = log_decay.float().exp(), head_output_gradients.float()
    result = torch.empty(batch, seq, heads, C.shape[-1], head_dim, device=gradients.device)
    # each L_t is written once, in place, into its slot: no state-sized temporaries per token
    for t in reversed(range(seq)):
        running = result[:, t]
        torch.mul(reading[:, t, :, :, None], gradients[:, t, :, None, :], out=running)
        if t + 1 < seq:
            running.add_(result[:, t + 1] * decay[:, t + 1, :, None, None])
    return result
