"""The gradient with respect to a Mamba-2 scan's state after each token: its recurrence run backwards.

Per head, the state after token ``t`` (key side first, ``[state_dim, head_dim]``) is
``h_t = exp(dt_t A) h_{t-1} + B_t (dt_t x_t)^T`` and the head output reads it, ``y_t = h_t^T C_t +
D x_t``, with ``B`` and ``C`` shared by the heads of a group. With the gates fixed, ``h_t`` reaches a
metric through ``y_t`` and ``h_{t+1}``, so its gradient ``L_t`` obeys::

    L_t = C_t (dM/dy_t)^T + exp(dt_{t+1} A) L_{t+1}

from the last token, where ``L`` starts at zero: a scalar decay per head and token, as forwards.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
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


class ScanRun(NamedTuple):
    """What ``ssd_state_patch_estimates`` needs of one run of a Mamba-2 scan call, tokens first, float32."""

    #: ``dt_t A`` per token and head, ``[batch, seq, heads]``
    log_decay: Tensor
    #: the keys, ``[batch, seq, groups, state_dim]``
    B: Tensor
    #: the queries, ``[batch, seq, groups, state_dim]``
    C: Tensor
    #: what each token writes, ``dt_t x_t``, ``[batch, seq, heads, head_dim]``
    written: Tensor
    #: the state the call starts from, key side first, ``[batch, heads, state_dim, head_dim]``
    entering: Tensor


@torch.no_grad()
def ssd_state_patch_estimates(
    clean: ScanRun, corrupt: ScanRun, head_output_gradients: Tensor, chunk_size: int = 64
) -> Tensor:
    """``(corrupt h_t - clean h_t) . L_t`` per token and head, ``[batch, seq, heads]``, without forming a state per token.

    ``L_t`` is the clean run's adjoint (``ssd_state_gradients``) from
    ``head_output_gradients`` ``[batch, seq, heads, head_dim]``. Written out,
    a run's state after ``t`` is a sum of its writes ``B_s (dt_s x_s)^T``,
    ``s <= t``, and ``L_t`` a sum of the clean readouts ``C_r g_r^T``, ``r >=
    t``, each decayed by the run's and the clean run's gates between; so
    ``h_t . L_t`` is a sum over pairs ``s <= t <= r`` of ``(B_s . C_r)(dt_s x_s
    . g_r)`` times those decays. Within a chunk of ``chunk_size`` tokens the
    pairs are a ``[chunk, chunk]`` matrix per head; across chunks the run's
    state entering a chunk and the adjoint leaving it stand for the pairs that
    reach outside it. The cost is a few matrix products per chunk, against the
    state after every token of both runs and the adjoint (three ``[seq,
    heads, state_dim, head_dim]`` tensors) that the product takes otherwise.
    Every exponent is a later cumulative log decay less an earlier one.

    A group's heads share its ``B`` and ``C``, so each product with them is
    taken once per group, its heads side by side: a chunk's per-head tensors
    are ``[chunk, heads of the group x head_dim]`` and its states ``[state_dim,
    heads of the group x head_dim]``.
    """
    batch, seq, heads, head_dim = head_output_gradients.shape
    groups = clean.C.shape[2]
    length = -(-seq // chunk_size) * chunk_size
    chunks = length // chunk_size
    per_group = heads // groups
    by_group = (batch, chunks, groups, chunk_size, per_group, head_dim)

    def chunked(tensor: Tensor) -> Tensor:
        """[batch, seq, ...] padded with zeros to whole chunks (no decay, no write, no read), as [batch, chunks, chunk, ...]."""
        padded = F.pad(tensor.float(), (0, 0) * (tensor.dim() - 2) + (0, length - seq))
        return padded.reshape(batch, chunks, chunk_size, *tensor.shape[2:])

    def rows(keys: Tensor) -> Tensor:
        """A group's B or C, [batch, seq, groups, state_dim], as [batch, chunks, groups, chunk, state_dim]."""
        return chunked(keys).transpose(2, 3).contiguous()

    def side_by_side(tensor: Tensor) -> Tensor:
        """[batch, seq, heads, head_dim] as [batch, chunks, groups, chunk, heads of the group, head_dim]."""
        return (
            chunked(tensor).reshape(batch, chunks, chunk_size, groups, per_group, head_dim).transpose(2, 3).contiguous()
        )

    def held_since_start(log_decay: Tensor) -> Tensor:
        """The log decay from each chunk's start, [batch, seq, heads] as [batch, chunks, groups, heads of the group, chunk]."""
        return (
            chunked(log_decay).reshape(batch, chunks, chunk_size, groups, per_group).permute(0, 1, 3, 4, 2).cumsum(-1)
        )

    def across(kept: Tensor) -> Tensor:
        """What a whole chunk keeps, as a factor of a state ``[..., state_dim, heads of the group x head_dim]``."""
        return kept[..., -1].exp().repeat_interleave(head_dim, dim=-1).unsqueeze(-2)

    def by_token(kept: Tensor) -> Tensor:
        """[..., heads of the group, chunk] as a factor of each token's ``[heads of the group, head_dim]``."""
        return kept.transpose(-1, -2).unsqueeze(-1)

    reading, gradients = rows(clean.C), side_by_side(head_output_gradients)
    held = held_since_start(clean.log_decay)
    # later[i, r]: what the clean gates keep from r back to i, for r >= i
    later = _decays(held.unsqueeze(-2) - held.unsqueeze(-1), upper=True)
    to_end = (held[..., -1:] - held).exp()
    # the adjoint leaving each chunk: L just after it, decayed to its last token
    from_chunk = reading.transpose(-1, -2) @ (gradients * by_token(held).exp()).flatten(-2)
    leaving, kept_by_chunk = torch.zeros_like(from_chunk), across(held)
    for chunk in reversed(range(chunks - 1)):
        torch.addcmul(
            from_chunk[:, chunk + 1], kept_by_chunk[:, chunk + 1], leaving[:, chunk + 1], out=leaving[:, chunk]
        )
    gradients_by_head = gradients.transpose(3, 4)

    def paired(run: ScanRun) -> Tensor:
        keys, written = rows(run.B), side_by_side(run.written)
        kept = held_since_start(run.log_decay)
        # earlier[i, s]: what this run's gates keep from s to i, for s <= i
        earlier = _decays(kept.unsqueeze(-1) - kept.unsqueeze(-2), upper=False)
        since_start = kept.exp()
        into = keys.transpose(-1, -2) @ (written * by_token(kept[..., -1:] - kept).exp()).flatten(-2)
        entering, kept_by_chunk = torch.empty_like(into), across(kept)
        # the entering state [batch, heads, state_dim, head_dim] with each group's heads side by side
        entering[:, 0] = (
            run.entering.float().reshape(batch, groups, per_group, -1, head_dim).transpose(2, 3).flatten(-2)
        )
        for chunk in range(1, chunks):
            torch.addcmul(
                into[:, chunk - 1], kept_by_chunk[:, chunk - 1], entering[:, chunk - 1], out=entering[:, chunk]
            )
        # [r, s]: the group's (C_r . B_s) times each head's (g_r . dt_s x_s)
        pairs = (reading @ keys.transpose(-1, -2)).unsqueeze(3) * (
            gradients_by_head @ written.permute(0, 1, 2, 4, 5, 3)
        )
        within = ((later @ pairs) * earlier).sum(-1)
        read_entering = ((reading @ entering).view(by_group) * gradients).sum(-1).transpose(-1, -2)  # [r]
        written_leaving = ((keys @ leaving).view(by_group) * written).sum(-1).transpose(-1, -2)  # [s]
        both = (entering * leaving).view(batch, chunks, groups, -1, per_group, head_dim).sum((-3, -1)).unsqueeze(-1)
        total = (
            within
            + since_start * (later @ read_entering.unsqueeze(-1)).squeeze(-1)
            + to_end * (earlier @ written_leaving.unsqueeze(-1)).squeeze(-1)
            + since_start * to_end * both
        )
        return total.permute(0, 1, 4, 2, 3).reshape(batch, length, heads)[:, :seq]

    return paired(corrupt) - paired(clean)


def _decays(exponents: Tensor, upper: bool) -> Tensor:
    """``exp`` of ``exponents`` [..., chunk, chunk] on and above (``upper``) or below the diagonal, zero elsewhere."""
    size = exponents.shape[-1]
    kept = torch.ones(size, size, dtype=torch.bool, device=exponents.device)
    kept = kept.triu() if upper else kept.tril()
    return exponents.masked_fill(~kept, float("-inf")).exp()
