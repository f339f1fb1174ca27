"""The math of a depthwise causal convolution seen as a recurrence: its window states, its token mixing, a window write.

A convolution of width ``k`` over inputs ``u`` (``B * x``), per channel::

    conv_t = bias + sum_{i < k} w[i] * u_{t - k + 1 + i}

reads nothing but the window of its last ``k`` inputs, so the state after
token ``t`` is that window, ``W_t[i] = u_{t - k + 1 + i}``, with the inputs
before a call taken from the window the call started from (zeros from an
empty cache), and ``conv_t = bias + w . W_t``. The window's oldest entry is
read by no later token: a window written after ``t`` reaches tokens
``t + 1 .. t + k - 1`` only. Tensors are channel-first as the conv takes them
(``[batch, channels, seq]``) unless said otherwise.
"""

from __future__ import annotations

import torch

from nnterp.analysis.mixing import TokenMixing
from nnterp.positions import Positions, select_positions


def _with_history(inputs: torch.Tensor, entering: torch.Tensor | None, k: int) -> torch.Tensor:
    """``inputs`` [batch, channels, seq] preceded by the window the call started from: [batch, channels, k + seq]."""
    if entering is None:
        entering = inputs.new_zeros((*inputs.shape[:-1], k))
    return torch.cat([entering.to(inputs.dtype), inputs], dim=-1)


def conv_windows(
    inputs: torch.Tensor, entering: torch.Tensor | None, k: int, positions: Positions = None
) -> torch.Tensor:
    """The window after each of ``positions``, [batch, positions, channels, k] (an int position drops the axis).

    ``inputs`` is the call's conv input [batch, channels, seq], ``entering``
    the window [batch, channels, k] the call started from, or ``None`` for
    zeros.
    """
    rows, order, single = select_positions(positions, inputs.shape[-1])
    history = _with_history(inputs, entering, k)
    # the window after token t is history[t + 1 : t + 1 + k]
    index = rows.to(inputs.device)[:, None] + 1 + torch.arange(k, device=inputs.device)
    windows = history[..., index].permute(0, 2, 1, 3)
    if order is not None:
        windows = windows[:, order.to(inputs.device)]
    return windows[:, 0] if single else windows


def window_mixing(
    inputs: torch.Tensor,
    gate: torch.Tensor,
    entering: torch.Tensor | None,
    weights: torch.Tensor,
    bias: torch.Tensor | None,
    rows: torch.Tensor,
    heads: torch.Tensor,
) -> TokenMixing:
    """The conv's token mixing of the values x at ``rows`` for the channels ``heads``, float32.

    ``inputs`` is the conv's input ``B * x`` and ``gate`` B, both [batch,
    channels, seq]. The matrix is [batch, heads, rows, seq]:
    ``M[t, j] = w[k - 1 - (t - j)] * B_j`` for ``0 <= t - j < k``, else 0. The offset,
    [batch, rows, heads], is the bias plus the entering window's part:
    ``bias + sum_{i : t - k + 1 + i < 0} w[i] * entering[k + t - k + 1 + i]``.
    """
    batch, _, seq = inputs.shape
    k = weights.shape[-1]
    device = inputs.device
    heads, rows = heads.to(device), rows.to(device)
    w = weights[heads].float()  # [heads, k]
    lag = rows[:, None] - torch.arange(seq, device=device)  # [rows, seq]: t - j
    band = (lag >= 0) & (lag < k)
    matrix = torch.where(band, w[:, (k - 1 - lag).clamp(0, k - 1)], w.new_zeros(()))  # [heads, rows, seq]
    matrix = matrix.unsqueeze(0) * gate[:, heads, None, :].float()
    offset = w.new_zeros((batch, len(rows), len(heads)))
    if entering is not None:
        # the entering window's entries are the inputs at positions -k .. -1
        history = torch.cat([entering[:, heads].float(), inputs.new_zeros((batch, len(heads), seq)).float()], dim=-1)
        index = rows[:, None] + 1 + torch.arange(k, device=device)
        offset = offset + (history[..., index] * w[None, :, None, :]).sum(-1).transpose(1, 2)
    if bias is not None:
        offset = offset + bias[heads].float()
    return TokenMixing(matrix, offset)


def conv_readout(state: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """The conv output reading ``state`` [batch, channels, k] as its window, repeated for ``rows`` rows: [batch, rows, channels]."""
    output = (state.float() * weights.float()).sum(-1)
    if bias is not None:
        output = output + bias.float()
    return output[:, None].expand(-1, rows, -1)


def written_window_effect(weights: torch.Tensor, change: torch.Tensor, t: int, seq: int) -> torch.Tensor:
    """What changing the window after token ``t`` by ``change`` [batch, channels, k] adds to a call's conv outputs.

    [batch, channels, seq]: zero up to ``t``; at ``t + s`` (``1 <= s < k``) the
    entries of the window still in reach, ``sum_{i >= s} w[i - s] * change[i]``.
    """
    k = weights.shape[-1]
    effect = change.new_zeros((*change.shape[:-1], seq))
    w = weights.to(change.dtype)
    for s in range(1, min(k, seq - t)):
        effect[..., t + s] = (w[:, : k - s] * change[..., s:]).sum(-1)
    return effect
