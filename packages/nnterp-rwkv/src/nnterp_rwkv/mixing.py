"""The token mixing of a WKV call: the exact matrix through which its outputs read the values.

Per channel, with ``w = exp(time_decay)`` and ``u = time_first``, token t's output is::

    out_t = (sum_{j < t} e^{k_j - (t-1-j) w} v_j + e^{u + k_t} v_t + e^{max - t w} num) / D_t
    D_t   =  sum_{j < t} e^{k_j - (t-1-j) w}     + e^{u + k_t}     + e^{max - t w} den

where (num, den, max) is the state the call starts from. ``D_t`` depends on the
keys only, so with the keys fixed the output is exactly linear in the values:
``M[t, j]`` is the numerator's weight on ``v_j`` over ``D_t``, and the entering
numerator's term over ``D_t`` is the offset. Computed in float64 through
log-sum-exps, so no exponential overflows, then handed back in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nnterp.analysis.mixing import TokenMixing

from .trajectory import entering, log_decay


def wkv_mixing(
    time_decay: Tensor,
    time_first: Tensor,
    key: Tensor,
    initial_state: Tensor | None,
    rows: Tensor,
    channels: Tensor,
) -> TokenMixing:
    """The token mixing of one WKV call at ``rows`` and ``channels``, from the call's arguments.

    ``time_decay`` and ``time_first`` ``[channels]``, ``key`` ``[batch, seq,
    channels]``: ``rwkv_linear_attention``'s arguments; ``initial_state``
    ``[batch, channels, 3]`` (num, den, max) the state the call starts from,
    ``None`` for the kernel's empty one. ``rows`` are sorted distinct positions.
    Returns the matrix ``[batch, channels, rows, seq]`` (zero past each row's
    token) and the offset ``[batch, rows, channels]``, so that
    ``mixed(matrix, value) + offset`` is the kernel's output at those rows.
    """
    rows, channels = rows.to(key.device), channels.to(key.device)
    batch, seq, _ = key.shape
    step = log_decay(time_decay)[channels]  # -w, [C]
    bonus = time_first.double()[channels]
    keys = key.float().double()[..., channels].transpose(1, 2)  # [batch, C, seq]
    num0, den0, top0 = (part[:, channels] for part in entering(initial_state, key))
    t = rows.double()[:, None]  # [R, 1]
    j = torch.arange(seq, dtype=torch.float64, device=key.device)  # [seq]
    # k_j - (t-1-j) w before the row, u + k_t at it, nothing after it: [batch, C, R, seq]
    lag = (t - 1 - j).clamp_min(0)
    exponents = keys[:, :, None, :] + lag[None, None] * step[None, :, None, None]
    own = (bonus[None, :, None] + keys[..., rows])[..., None]  # [batch, C, R, 1]
    exponents = torch.where(j == t, own, exponents)
    exponents = exponents.masked_fill(j > t, float("-inf"))
    # the entering state, decayed by t steps: its log denominator per row
    carried = top0[..., None] + t.T * step[None, :, None]  # [batch, C, R]
    # the tokens' part of D_t in logs, the entering state's (a written one may be negative) beside it, both over ref
    tokens = torch.logsumexp(exponents, -1)
    ref = torch.maximum(tokens, carried)
    entering_weight = (carried - ref).exp()
    denominator = (tokens - ref).exp() + den0[..., None] * entering_weight
    matrix = (exponents - ref[..., None]).exp() / denominator[..., None]
    offset = num0[..., None] * entering_weight / denominator
    return TokenMixing(matrix.float(), offset.transpose(1, 2).float())


def wkv_readout(time_first: Tensor, key: Tensor, value: Tensor, state: Tensor, rows: Tensor) -> Tensor:
    """The outputs at ``rows`` of a call, each token starting from ``state`` ``[batch, channels, 3]``: ``[batch, rows, channels]``.

    RWKV's output at t reads the state the token enters with, plus its own
    value at the bonus weight ``e^{u + k_t}``: ``(e^max num + e^{u+k_t} v_t) / (e^max den + e^{u+k_t})``,
    computed as the kernel does, over the larger exponent, in float64.
    """
    rows = rows.to(key.device)
    num, den, top = (part[:, None] for part in state.double().unbind(-1))
    own = time_first.double() + key[:, rows].float().double()
    ref = torch.maximum(top, own)
    carried, fresh = (top - ref).exp(), (own - ref).exp()
    return ((carried * num + fresh * value[:, rows].double()) / (carried * den + fresh)).float()
