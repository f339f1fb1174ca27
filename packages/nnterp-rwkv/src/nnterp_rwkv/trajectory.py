"""The WKV state after every token of one call, computed at once from the call's arguments.

``rwkv_linear_attention_cpu`` carries, per channel, a numerator, a denominator
and a max exponent: the real numerator is ``num * exp(max)``. After token t,
with ``w = exp(time_decay)``, the real sums are::

    num_t = sum_{i <= t} exp(k_i - (t - i) w) v_i     den_t = sum_{i <= t} exp(k_i - (t - i) w)

plus the entering state decayed by ``t + 1`` steps. Writing ``a_i = k_i + i w``,
each term is ``exp(a_i - t w)``, so both sums are cumulative log-sum-exps of
``a`` (the values split by sign), and the kernel's max exponent is the
cumulative max of ``a`` less ``t w``. Everything is float64: ``a`` grows with
``t w``, and float64 keeps its differences exact to far below float32's rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nnterp.positions import Positions, select_positions

#: The stabilizer the kernel starts from when it is given no state.
EMPTY_MAX = -1e38


def entering(initial_state: Tensor | None, key: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The (numerator, denominator, max exponent) a call starts from, float64 ``[batch, channels]`` each."""
    if initial_state is None:
        zeros = key.new_zeros(key.shape[0], key.shape[2], dtype=torch.float64)
        return zeros, zeros, torch.full_like(zeros, EMPTY_MAX)
    num, den, top = initial_state.double().unbind(-1)
    return num, den, top


def log_decay(time_decay: Tensor) -> Tensor:
    """``-exp(time_decay)`` in the parameter's dtype, as the kernel computes it, then float64."""
    return (-torch.exp(time_decay)).double()


def wkv_states(
    time_decay: Tensor,
    key: Tensor,
    value: Tensor,
    initial_state: Tensor | None = None,
    positions: Positions = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The kernel's state after ``positions`` of one call, ``[batch, positions, channels, 3]`` (num, den, max).

    ``time_decay`` ``[channels]``, ``key`` and ``value`` ``[batch, seq, channels]``
    are ``rwkv_linear_attention``'s arguments; ``initial_state`` ``[batch,
    channels, 3]`` is the state it starts from, ``None`` for the kernel's empty
    one. The max exponent is the kernel's (the largest exponent seen, decayed),
    so the three parts equal the token loop's to float rounding. ``positions``
    indexes the call's tokens as ``states[:, positions]`` would (an int drops the axis).
    """
    seq = key.shape[1]
    step = log_decay(time_decay)  # -w
    ticks = torch.arange(seq, dtype=torch.float64, device=key.device)[:, None]
    exponents = key.float().double() - ticks * step  # a_i = k_i + i w
    num0, den0, top0 = entering(initial_state, key)
    # the entering state is a token at i = -1 whose exponent is its max: a_{-1} = max - w
    carried = top0 + step  # the entering state is a token at i = -1 whose exponent is its max: max - w
    peak = torch.maximum(torch.cummax(exponents, 1).values, carried[:, None])
    # the entering state's terms only decay: exp(a_{-1} - peak_t) times its sums (a written one may be negative)
    entering_weight = (carried[:, None] - peak).exp()
    den = (torch.logcumsumexp(exponents, 1) - peak).exp()
    # the values shifted positive by a per-channel constant, so one log-sum-exp holds the numerator; the shift's
    # sum is the denominator's, taken back out (float64 keeps the difference exact far below float32's rounding)
    shift = value.double().abs().amax(1, keepdim=True) + 1
    num = (torch.logcumsumexp(exponents + (value.double() + shift).log(), 1) - peak).exp() - shift * den
    num = num + num0[:, None] * entering_weight
    den = den + den0[:, None] * entering_weight
    states = torch.stack([num, den, peak + ticks * step], -1)
    rows, order, single = select_positions(positions, seq)
    states = states[:, rows.to(states.device)]
    if order is not None:
        states = states[:, order.to(states.device)]
    return (states[:, 0] if single else states).to(dtype)
