"""The token mixing of a Mamba-1 selective scan: the exact matrix through which its outputs read x.

Every channel c of the scan runs ``state_dim`` scalar recurrences,
``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, read out as ``y_t = C_t . h_t + D x_t``. Unrolled,
with ``S_t`` the sum of the channel's steps over tokens ``0..t``::

    y_t = sum_{j <= t} M[t, j] x_j  +  C_t . (exp(A S_t) h_0)  +  D x_t
    M[t, j] = dt_j  sum_n C_t[n] B_j[n] exp(A[n] (S_t - S_j))

``S_t - S_j`` is how far token j's write has decayed by token t. The first sum is the matrix; the
readout of the state the call started from (``h_0``, zeros on a prompt) and the skip are the offset.

Every column up to the first asked row r is read through r's own token, ``exp(A (S_t - S_j)) =
exp(A (S_t - S_r)) exp(A (S_r - S_j))``: each row's factor is taken once, each column's once, and
one matrix product per channel over the state writes them straight into the result, so asking for
the last rows of a long call costs about one exponential per column and state entry. The columns
after r are taken in blocks of ``BLOCK`` tokens. A row inside a block is computed as written
above, a ``[rows, columns, state_dim]`` product per channel. A row after it goes through the block's
last token a, ``exp(A (S_t - S_j)) = exp(A (S_t - S_a)) exp(A (S_a - S_j))``: a row's factor times a
column's factor, summed over the state in one matrix product, with ``BLOCK`` times fewer
exponentials and no product over rows, columns and state at once. Every sum of steps is one
cumulative sum from its own start (the block's first token inside it, its last token after it),
never the difference of two sums from the call's start: its rounding stays relative to its own
size, and ``A`` (negative) times it is never positive, so no exponential can overflow.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from nnterp.analysis.mixing import TokenMixing

from .trajectory import step_sizes

#: Tokens per block of columns: a row inside a block costs ``BLOCK * state_dim`` per channel, one after it ``state_dim``.
BLOCK = 32
#: The most bytes of float32 temporaries one step of the computation holds.
TEMPORARY_BYTES = 64 * 2**20


def selective_scan_mixing(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    initial_state: Tensor | None,
    rows: Tensor,
    channels: Tensor,
    *,
    dt_bias: Tensor | None = None,
    softplus: bool = True,
) -> TokenMixing:
    """The token mixing of one Mamba-1 scan call at ``rows`` and ``channels``, from the call's arguments, in float32.

    The arguments are ``mamba_selective_scan``'s, channel-first as the mixer passes them: ``x``
    and ``dt`` ``[batch, channels, seq]`` (``dt`` before its bias ``dt_bias`` and ``softplus``,
    applied in ``dt``'s dtype as the kernel does), ``A`` ``[channels, state_dim]``, ``B`` and ``C``
    ``[batch, state_dim, seq]``, ``D`` ``[channels]`` or ``None``; ``initial_state`` ``[batch,
    channels, state_dim]`` is the state the call starts from, ``None`` for zeros. A decode step is
    a call of one token: its arguments with a sequence axis of 1, its cached state as
    ``initial_state``. ``rows`` are sorted, distinct positions of the call, ``channels`` channel
    indices.

    Returns the matrix ``[batch, channels, rows, seq]`` (zero past each row's own token) and the
    offset ``[batch, rows, channels]`` (the readout of ``initial_state`` and ``D x``), so that
    ``mixed(matrix, x)`` plus the offset is the scan's ``C . h + D x`` at those rows, before its
    ``silu(z)`` gate. Only tokens up to the last row are read.

    Rows and channels are taken as given (``token_mixing`` checks them against the call): one
    outside it raises ``IndexError`` on the CPU and a device-side assert on CUDA, and ``rows`` not
    sorted and distinct give a wrong matrix, not an error.
    """
    batch, _, seq = x.shape
    rows, channels = rows.to(x.device), channels.to(x.device)
    end = int(rows[-1]) + 1 if len(rows) else 0
    # every entry is written but those past each row's own token, which are zeroed: no pass over the whole of it
    matrix = torch.empty(batch, len(channels), len(rows), seq, device=x.device)
    for index, position in enumerate(rows.tolist()):
        matrix[:, :, index, position + 1 :] = 0
    offset = torch.empty(batch, len(rows), len(channels), device=x.device)
    # the largest temporary, per channel: a block's rows inside it against its columns, per state entry
    for chosen in _blocks(len(channels), 4 * batch * BLOCK * BLOCK * A.shape[-1]):
        picked = channels[chosen]
        bias = None if dt_bias is None else dt_bias[picked]
        scan = _ChannelBlock(step_sizes(dt[:, picked, :end], bias, softplus), A[picked].float(), B, C, rows)
        scan.write_matrix(matrix[:, chosen])
        offset[:, :, chosen] = scan.offset(x[:, picked][..., rows], D, initial_state, picked).transpose(1, 2)
    return TokenMixing(matrix, offset)


class _ChannelBlock:
    """Some channels of one scan call, over its tokens up to the last asked row: steps, rates, B and C in float32."""

    def __init__(self, step: Tensor, rate: Tensor, B: Tensor, C: Tensor, rows: Tensor) -> None:
        batch, channels, self.end = step.shape
        self.step = step  # [batch, channels, end]
        self.rate = rate  # A, [channels, state_dim]
        self.keys = B[..., : self.end].float()  # [batch, state_dim, end]
        self.queries = C[..., rows].float()  # [batch, state_dim, rows]
        self.rows = rows
        self.positions = rows.tolist()
        # a row's temporaries after a block: its factor per state entry, then its product with the block
        self.bytes_per_row = 4 * batch * channels * (rate.shape[-1] + BLOCK)

    def write_matrix(self, matrix: Tensor) -> None:
        """Fill ``matrix`` ``[batch, channels, rows, seq]``, zeros on entry: the columns up to the first row through
        it, then one block of columns at a time."""
        if not self.positions:
            return
        first = self.positions[0]
        self._columns_before_the_rows(matrix[..., : first + 1], first)
        for start in range(first + 1, self.end, BLOCK):
            stop = min(start + BLOCK, self.end)
            # rows before the block read none of it; rows[inside:after] lie in it; rows[after:] come after it
            inside, after = bisect_left(self.positions, start), bisect_left(self.positions, stop)
            elapsed = self._elapsed_since(start, stop)
            if after > inside:
                matrix[:, :, inside:after, start:stop] = self._rows_inside(inside, after, start, stop, elapsed)
            if after < len(self.positions):
                self._rows_after(matrix[:, :, after:, start:stop], after, start, stop, elapsed)

    def _rows_inside(self, first: int, last: int, start: int, stop: int, elapsed: Tensor) -> Tensor:
        """Rows ``first:last``, inside the block ``start:stop``, against its columns: [batch, channels, rows, block]."""
        within = self.rows[first:last] - start
        causal = torch.arange(stop - start, device=within.device) <= within[:, None]  # [rows, block]
        # S_t - S_j, negative only where j comes after t: clamped there, and masked below
        gap = (elapsed[..., within, None] - elapsed[..., None, :]).clamp_min(0)
        # the one temporary of the block's size, [batch, channels, rows, block, state_dim], made and then used in place
        decay = (gap[..., None] * self.rate[:, None, None]).exp_()
        queries = self.queries[..., first:last].transpose(1, 2)  # [batch, rows, state_dim]
        keys = self.keys[..., start:stop].transpose(1, 2)  # [batch, block, state_dim]
        read_times_written = decay.mul_((queries[:, :, None] * keys[:, None])[:, None]).sum(-1)
        return (read_times_written * self.step[:, :, None, start:stop]).where(causal, 0)

    def _rows_after(self, out: Tensor, first: int, start: int, stop: int, elapsed: Tensor) -> None:
        """Rows from ``first`` on, all after the block ``start:stop``, through its last token: written into ``out``."""
        anchor = stop - 1
        rate = self.rate[..., None]  # against a trailing axis of tokens
        # what each of the block's writes is worth by the anchor, per state entry: [batch, channels, state_dim, block]
        writes = (
            self.keys[:, None, :, start:stop]
            * torch.exp(rate * (elapsed[..., -1:] - elapsed)[:, :, None])
            * self.step[:, :, None, start:stop]
        )
        since_anchor = self._elapsed_since(anchor, self.end)
        for chunk in _blocks(out.shape[2], self.bytes_per_row):
            asked = self.rows[first:][chunk]
            # C_t times its decay since the anchor: [batch, channels, state_dim, rows]
            reads = (rate * since_anchor[..., asked - anchor][:, :, None]).exp_()
            reads.mul_(self.queries[:, None, :, first:][..., chunk])
            out[:, :, chunk] = reads.transpose(-1, -2) @ writes

    def _columns_before_the_rows(self, out: Tensor, first: int) -> None:
        """Every row against the columns ``0..first`` (the first row's position), through that first row's token r:
        ``exp(A (S_t - S_j)) = exp(A (S_t - S_r)) exp(A (S_r - S_j))``, each row's factor taken once for all of
        them. ``S_r - S_j`` is summed backwards from r, so a column far from the rows is as exact as a near one.
        Some channels at a time, each product written straight into ``out``."""
        since_first = self._elapsed_since(first, self.end)[..., self.rows - first]  # S_t - S_r: [batch, channels, rows]
        until_first = F.pad(self.step[..., 1 : first + 1].flip(-1).cumsum(-1).flip(-1), (0, 1))  # S_r - S_j
        batch, channels = self.step.shape[:2]
        for chosen in _blocks(channels, 4 * batch * self.rate.shape[-1] * (first + 1)):
            rate = self.rate[chosen, :, None]  # [channels, state_dim, 1]: against a trailing axis of tokens
            reads = (rate * since_first[:, chosen, None]).exp_().mul_(self.queries[:, None])
            writes = (rate * until_first[:, chosen, None]).exp_()
            writes.mul_(self.keys[:, None, :, : first + 1]).mul_(self.step[:, chosen, None, : first + 1])
            torch.matmul(reads.transpose(-1, -2), writes, out=out[:, chosen])

    def offset(self, x: Tensor, D: Tensor | None, initial_state: Tensor | None, channels: Tensor) -> Tensor:
        """The skip ``D x`` (``x`` at the rows) and the readout of ``initial_state``: [batch, channels, rows]."""
        offset = x.float() * D[channels].float()[:, None] if D is not None else torch.zeros_like(x, dtype=torch.float32)
        if initial_state is None:
            return offset
        entering = initial_state[:, channels].float()[..., None]  # [batch, channels, state_dim, 1]
        since_start = self.step.cumsum(-1)  # S_t: token 0's own step decays the entering state too
        for chunk in _blocks(len(self.positions), self.bytes_per_row):
            decayed = (self.rate[..., None] * since_start[..., self.rows[chunk]][:, :, None]).exp_().mul_(entering)
            offset[..., chunk] += decayed.mul_(self.queries[:, None, :, chunk]).sum(2)
        return offset

    def _elapsed_since(self, anchor: int, stop: int) -> Tensor:
        """``S_t - S_anchor`` for ``t`` in ``anchor:stop``, [batch, channels, stop - anchor], summed from the anchor.

        Non-decreasing along ``t``, as a cumulative sum of non-negative steps is in floating point too.
        """
        return F.pad(self.step[..., anchor + 1 : stop].cumsum(-1), (1, 0))


def _blocks(count: int, bytes_each: int) -> Iterator[slice]:
    """Slices of ``range(count)`` whose items hold at most ``TEMPORARY_BYTES`` together (one item at least)."""
    size = max(1, TEMPORARY_BYTES // bytes_each)
    return (slice(start, min(start + size, count)) for start in range(0, count, size))


def selective_scan_readout(x: Tensor, C: Tensor, D: Tensor | None, state: Tensor, rows: Tensor) -> Tensor:
    """What the tokens at ``rows`` read from ``state``: ``C_t . h + D x_t`` per channel, ``[batch, rows, channels]``.

    ``x`` ``[batch, channels, seq]`` and ``C`` ``[batch, state_dim, seq]`` are the scan's arguments
    (a decode step's with a sequence axis of 1), ``state`` ``[batch, channels, state_dim]``: the
    head outputs those tokens would give with ``state`` as the state after each of them, float32.
    """
    rows = rows.to(x.device)
    read = torch.einsum("bnt,bcn->btc", C[..., rows].float(), state.float())
    return read if D is None else read + (D.float()[:, None] * x[..., rows].float()).transpose(1, 2)
