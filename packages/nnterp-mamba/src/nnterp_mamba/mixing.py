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
one matrix product per channel over the state writes them straight into the result (zeros past r),
so asking for the last rows of a long call costs about one exponential per column and state entry
and no pass over the result but that product. The columns after r are taken in blocks of at most
``BLOCK`` tokens, all blocks at once. A row inside a block is computed as written
above, a ``[rows, columns, state_dim]`` product per channel. A row after it goes through the block's
last token a, ``exp(A (S_t - S_j)) = exp(A (S_t - S_a)) exp(A (S_a - S_j))``: a row's factor times a
column's factor, summed over the state in one matrix product, with ``BLOCK`` times fewer
exponentials and no product over rows, columns and state at once. Every sum of steps is one
cumulative sum from its own start (the block's first token inside it, its last token after it),
never the difference of two sums from the call's start: its rounding stays relative to its own
size, and ``A`` (negative) times it is never positive, so no exponential can overflow.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from nnterp.analysis.mixing import TokenMixing

from .trajectory import step_sizes

#: The most tokens per block of columns (``_token_block``): a row inside a block costs ``block * state_dim`` per
#: channel, one after it ``state_dim``.
BLOCK = 32
#: The most bytes of float32 temporaries one step of the computation holds.
TEMPORARY_BYTES = 64 * 2**20
#: Just above the log of float32's smallest normal number (-87.34): ``_decay`` takes no exponential below it.
SMALLEST_EXPONENT = -87.0


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
    # every entry is written once by the product through the first row (zeros past it), no pass to clear it first
    matrix = torch.empty(batch, len(channels), len(rows), seq, device=x.device)
    offset = torch.empty(batch, len(rows), len(channels), device=x.device)
    for chosen in _blocks(len(channels), _bytes_per_channel(batch, A.shape[-1], seq, rows), matrix.numel()):
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
        # a row's temporary in the offset: the entering state's decay to it, per channel and state entry
        self.bytes_per_row = 4 * batch * channels * rate.shape[-1]

    def write_matrix(self, matrix: Tensor) -> None:
        """Fill ``matrix`` ``[batch, channels, rows, seq]``, uninitialized on entry: every column through the first
        row (zeros past it), then the columns after it."""
        if not self.positions:
            return
        first = self.positions[0]
        self._columns_before_the_rows(matrix, first)
        if self.end > first + 1:
            # every later row is after the first: the rows are sorted and distinct
            matrix[:, :, 1:, first + 1 : self.end] = self._columns_after_the_first_row(first)

    def _columns_after_the_first_row(self, first: int) -> Tensor:
        """The rows after the first one against the columns after it, in blocks of columns: [batch, channels, rows
        but the first, columns].

        A row against its own block is computed as written, its decay summed back from the row over
        the block, a ``[rows, block, state_dim]`` product per channel. A row against an earlier block
        goes through that block's last token a, ``exp(A (S_t - S_j)) = exp(A (S_t - S_a)) exp(A (S_a -
        S_j))``: a row's factor and a column's, summed over the state by one matrix product per channel
        and block, for the rows after that block only.
        """
        block, (batch, channels, _) = _token_block(len(self.positions)), self.step.shape
        columns = self.end - first - 1
        count = -(-columns // block)
        # padded with steps of zero, which write nothing, to whole blocks: [batch, channels, blocks, block]
        step = F.pad(self.step[..., first + 1 :], (0, count * block - columns)).unflatten(-1, (count, block))
        keys = F.pad(self.keys[..., first + 1 :], (0, count * block - columns)).unflatten(-1, (count, block))
        offsets = self.rows[1:] - first - 1  # each row's column
        own, at = offsets // block, offsets % block  # each row's block and its place in it
        rate = self.rate[:, None, None, :]  # [channels, 1, 1, state_dim]: against [..., tokens, state_dim]

        # each row against its own block: S_t - S_j summed inside the block, clamped at 0 past the row (masked)
        inside = F.pad(step[..., 1:].cumsum(-1), (1, 0))  # S_j - S_(block's first token)
        inside = inside[:, :, own]  # [batch, channels, rows, block]
        gap = (inside.gather(-1, at.expand(batch, channels, -1)[..., None]) - inside).clamp_min_(0)
        products = self.queries[:, :, 1:, None] * keys[:, :, own]  # C_t B_j: [batch, state_dim, rows, block]
        decays = _decay(gap[..., None] * rate).mul_(products.permute(0, 2, 3, 1)[:, None])
        own_block = decays.sum(-1).mul_(step[:, :, own])
        own_block.masked_fill_(torch.arange(block, device=at.device) > at[:, None], 0)

        # each row against every earlier block, through the block's last token; 0 from its own block on
        window = own_block.new_zeros(batch, channels, len(own), count, block)
        rows = torch.arange(len(own), device=own.device)
        window[:, :, rows, own] = own_block
        to_anchor = F.pad(step[..., 1:].flip(-1).cumsum(-1).flip(-1), (0, 1))  # S_a - S_j, summed back from a
        writes = _decay(to_anchor[..., None] * rate)
        writes = writes.mul_(keys.permute(0, 2, 3, 1)[:, None]).mul_(step[..., None])  # [batch, ch, blocks, block, n]
        queries = self.queries[:, None, :, 1:].transpose(-1, -2)  # [batch, 1, rows, state_dim]
        flat = step.flatten(-2)
        # the rows after block b are those from the first whose own block is past b (the rows are sorted)
        for b, later in enumerate(torch.searchsorted(own, torch.arange(count, device=own.device), right=True).tolist()):
            if later == len(own):
                break
            anchor = (b + 1) * block - 1
            since_anchor = F.pad(flat[..., anchor + 1 :].cumsum(-1), (1, 0))  # S_t - S_a, from a
            reads = _decay(since_anchor[..., offsets[later:] - anchor, None] * rate[:, 0]).mul_(queries[..., later:, :])
            window[:, :, later:, b] = reads @ writes[:, :, b].transpose(-1, -2)
        return window.flatten(-2)[..., :columns]

    def _columns_before_the_rows(self, out: Tensor, first: int) -> None:
        """Every row against the columns ``0..first`` (the first row's position), through that first row's token r:
        ``exp(A (S_t - S_j)) = exp(A (S_t - S_r)) exp(A (S_r - S_j))``, each row's factor and each column's taken
        once. ``S_r - S_j`` is summed backwards from r, so a column far from the rows is as exact as a near one.

        The columns after r enter the product with zero weight, so it writes every entry of ``out`` ``[batch,
        channels, rows, seq]``: the zeros of those columns are already right for the rows before each later
        block, and each batch row's product goes straight into its contiguous part of ``out`` (a strided result
        would take a much slower path through the matrix product)."""
        since_first = self._elapsed_since(first, self.end)[..., self.rows - first]  # S_t - S_r: [batch, channels, rows]
        until_first = F.pad(self.step[..., 1 : first + 1].flip(-1).cumsum(-1).flip(-1), (0, 1))  # S_r - S_j
        rate = self.rate[..., None]  # [channels, state_dim, 1]: against a trailing axis of tokens
        reads = _decay(rate * since_first[:, :, None]).mul_(self.queries[:, None])
        batch, channels, state_dim = *self.step.shape[:2], self.rate.shape[-1]
        writes = self.step.new_empty(batch, channels, state_dim, out.shape[-1])
        writes[..., first + 1 :] = 0
        written = writes[..., : first + 1]
        torch.mul(rate, until_first[:, :, None], out=written)
        _decay(written).mul_(self.keys[:, None, :, : first + 1]).mul_(self.step[:, :, None, : first + 1])
        for row in range(batch):
            torch.matmul(reads[row].transpose(-1, -2), writes[row], out=out[row])

    def offset(self, x: Tensor, D: Tensor | None, initial_state: Tensor | None, channels: Tensor) -> Tensor:
        """The skip ``D x`` (``x`` at the rows) and the readout of ``initial_state``: [batch, channels, rows]."""
        offset = x.float() * D[channels].float()[:, None] if D is not None else torch.zeros_like(x, dtype=torch.float32)
        if initial_state is None:
            return offset
        entering = initial_state[:, channels].float()[..., None]  # [batch, channels, state_dim, 1]
        since_start = self.step.cumsum(-1)  # S_t: token 0's own step decays the entering state too
        for chunk in _blocks(len(self.positions), self.bytes_per_row):
            decayed = _decay(self.rate[..., None] * since_start[..., self.rows[chunk]][:, :, None]).mul_(entering)
            offset[..., chunk] += decayed.mul_(self.queries[:, None, :, chunk]).sum(2)
        return offset

    def _elapsed_since(self, anchor: int, stop: int) -> Tensor:
        """``S_t - S_anchor`` for ``t`` in ``anchor:stop``, [batch, channels, stop - anchor], summed from the anchor.

        Non-decreasing along ``t``, as a cumulative sum of non-negative steps is in floating point too.
        """
        return F.pad(self.step[..., anchor + 1 : stop].cumsum(-1), (1, 0))


def _token_block(rows: int) -> int:
    """Tokens per block of columns after the first row, for ``rows`` asked rows: at most ``BLOCK``.

    A block costs each row inside it the block's width, and each row after it one factor: about
    ``rows * block + rows**2 / block`` in all, least near ``block = sqrt(rows)``, rounded to a power of two.
    """
    return min(BLOCK, max(8, 1 << round(math.log2(max(1, rows)) / 2)))


def _decay(exponent: Tensor) -> Tensor:
    """``exp`` of ``exponent`` (non-positive) in place, each entry first raised to ``SMALLEST_EXPONENT``.

    Below it ``exp`` is (or nears) a subnormal number, which a CPU computes many times slower than a
    normal one; the entry it gives instead, ``1.6e-38``, is as far below float32's resolution of any
    sum it enters as the true one.
    """
    return exponent.clamp_min_(SMALLEST_EXPONENT).exp_()


def _bytes_per_channel(batch: int, state_dim: int, seq: int, rows: Tensor) -> int:
    """The float32 temporaries one channel of ``_ChannelBlock.write_matrix`` holds at once, at most, in bytes."""
    if not len(rows):
        return 1
    block, columns = _token_block(len(rows)), seq - int(rows[0])
    # the writes through the first row and per block after it; each row against its own block, and its factor at one
    # earlier block; the rows after the first against the columns after it, twice
    return 4 * batch * (state_dim * (2 * seq + len(rows) * (block + 1)) + 2 * len(rows) * columns)


def _blocks(count: int, bytes_each: int, most: int = 0) -> Iterator[slice]:
    """Slices of ``range(count)`` whose items hold at most ``TEMPORARY_BYTES``, or ``most`` if more, together (one item
    at least). A computation whose result is large is let temporaries of a share of it: fewer, larger steps."""
    size = max(1, max(TEMPORARY_BYTES, most) // bytes_each)
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
