"""The exact token mixing of one Mamba-2 (SSD) scan call, computed from the call's own arguments.

Per head, with ``a_t = A dt_t`` the log of how much of the state token ``t`` keeps, the scan runs
``h_t = exp(a_t) h_{t-1} + dt_t B_t x_t^T`` and reads ``y_t = C_t^T h_t + D x_t``. Unrolled, ``y`` is
linear in the values ``x``::

    y_t = sum_{j <= t} M[t, j] x_j  +  exp(a_0 + ... + a_t) C_t^T h_start  +  D x_t
    M[t, j] = (C_t . B_j) dt_j exp(a_{j+1} + ... + a_t)

``M`` is the head's matrix (its group's ``C . B`` scores, weighted by the write's step and the
decay in between); the last two terms, the readout of the state the call started from and the
skip, are the offset.

Each entry's decay exponent is summed from its row back to its column, never taken as the
difference of two running sums from the call's start: over thousands of tokens those sums reach
hundreds, and their difference would lose the float32 digits an entry near the diagonal needs.
The rows are computed in blocks within ``WINDOW`` tokens of the block's first row, each only up to
its last row's token. A token up to that first row decays to a row through it: a factor per
token times a factor per row, each the ``exp`` of one sum from the first row, so those entries,
most of the matrix, cost two products and no ``exp``; only the tokens inside the window take an
``exp`` each. ``C . B`` is one matrix product per group, and each block is written straight into
the result, so no ``[rows, tokens, state_dim]`` product, no per-token state and no full-size mask
is ever formed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nnterp.analysis.mixing import TokenMixing

from .trajectory import step_sizes

#: Entries of one block of rows' ``[batch, heads, rows, tokens]`` temporaries (a few live at once, float32).
BLOCK_ELEMENTS = 1 << 24
#: The most tokens between a block's rows, so the running sums they subtract hold few terms (``_decays_through``).
WINDOW = 64
#: Just above the log of float32's smallest normal number (-87.34): ``_decay`` takes no exponential below it.
SMALLEST_EXPONENT = -87.0


def ssd_mixing(
    hidden_states: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    rows: Tensor,
    heads: Tensor,
    *,
    D: Tensor | None = None,
    initial_state: Tensor | None = None,
    dt_bias: Tensor | None = None,
    softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> TokenMixing:
    """The token mixing of one Mamba-2 scan call at ``rows`` and ``heads``: its SSD matrix and the rest of y, float32.

    The arguments are ``mamba2_chunk_scan``'s, as ``ssd_states`` takes them: ``hidden_states`` (x)
    ``[batch, seq, heads, head_dim]``, ``dt`` ``[batch, seq, heads]`` before its bias (``dt_bias``,
    ``softplus`` and ``dt_limit`` applied as the scan does, ``step_sizes``), ``A`` ``[heads]``, ``B``
    and ``C`` ``[batch, seq, groups, state_dim]`` (each group shared by ``heads // groups``
    consecutive heads), ``D`` ``[heads]`` (``None``: no skip), ``initial_state`` in the cache's layout
    ``[batch, heads, head_dim, state_dim]`` (``None``: zeros). ``rows`` are positions of the call and
    ``heads`` head indices, both LongTensors.

    Returns ``TokenMixing(matrix, offset)``: ``matrix`` ``[batch, len(heads), len(rows), seq]``, zero
    past each row's own token; ``offset`` ``[batch, len(rows), len(heads), head_dim]``, the readout
    of ``initial_state`` plus ``D x``. ``mixed(matrix, x) + offset`` is the scan's output at those
    rows and heads to float32 rounding. Only tokens up to the last row are read. A position or
    head out of range raises IndexError from the indexing; a ``D`` or ``initial_state`` that does
    not cover every head of ``hidden_states`` does too.
    """
    device = hidden_states.device
    rows, heads = rows.to(device), heads.to(device)
    batch, seq, num_heads, head_dim = hidden_states.shape
    # the groups the asked heads read, and each head's index among them: C . B is computed once per group
    groups, group_of_head = torch.unique(heads // (num_heads // B.shape[2]), return_inverse=True)
    end = int(rows.max()) + 1 if len(rows) else 0  # later tokens reach no asked row

    step = step_sizes(dt[:, :end, heads], None if dt_bias is None else dt_bias[heads], softplus, dt_limit)
    step = step.transpose(1, 2)  # [batch, heads, tokens]
    log_decay = A.float()[heads, None] * step
    keys = B[:, :end, groups].float().transpose(1, 2)  # [batch, groups, tokens, state_dim]
    queries = C[:, rows][:, :, groups].float().transpose(1, 2)  # [batch, groups, rows, state_dim]

    # every entry is written below, the zeros past each row's token too: no pass to clear it first
    matrix = hidden_states.new_empty((batch, len(heads), len(rows), seq), dtype=torch.float32)
    runs = _runs(group_of_head.tolist())
    block_rows = max(1, BLOCK_ELEMENTS // max(1, batch * len(groups) * end))
    for block in _row_blocks(rows, block_rows):
        positions = rows[block]
        anchor, block_end = int(positions.min()), int(positions.max()) + 1
        scores = queries[:, :, block] @ keys[:, :, :block_end].transpose(-1, -2)  # [batch, groups, rows, tokens]
        writes, reads, window = _decays_through(log_decay[..., :block_end], positions - anchor)
        writes.mul_(step[..., : anchor + 1])
        window.mul_(step[:, :, None, anchor + 1 : block_end])
        first = int(block[0])
        # a block of consecutive rows is written in place; one of rows asked out of order goes through a copy
        in_place = bool((block == torch.arange(first, first + len(block), device=device)).all())
        target = (
            matrix[:, :, first : first + len(block)]
            if in_place
            else matrix.new_empty(batch, len(heads), len(block), seq)
        )
        target[..., block_end:] = 0
        for run, group in runs:
            out, own = target[:, run], scores[:, group, None]
            torch.mul(own[..., : anchor + 1], writes[:, run, None], out=out[..., : anchor + 1])
            out[..., : anchor + 1].mul_(reads[:, run, :, None])
            torch.mul(own[..., anchor + 1 :], window[:, run], out=out[..., anchor + 1 : block_end])
        if not in_place:
            matrix[:, :, block] = target

    offset = ssd_readout(hidden_states, C, D, None, rows, heads)
    if initial_state is not None:
        # the start state decays through every token up to the row, the row's own included
        entering = log_decay.cumsum(-1)[..., rows].exp().transpose(1, 2)[..., None]
        offset += entering * ssd_readout(hidden_states, C, None, initial_state.transpose(-1, -2), rows, heads)
    return TokenMixing(matrix, offset)


def ssd_readout(
    hidden_states: Tensor,
    C: Tensor,
    D: Tensor | None,
    state: Tensor | None,
    rows: Tensor,
    heads: Tensor | None = None,
) -> Tensor:
    """The scan's head outputs at ``rows`` were each to read ``state``: ``C_t^T state + D x_t``, float32.

    ``hidden_states`` (x) ``[batch, seq, heads, head_dim]``, ``C`` ``[batch, seq, groups, state_dim]`` and
    ``D`` ``[heads]`` are the scan's (``None``: no skip); ``state`` is one state for every row, key side
    first, ``[batch, heads, state_dim, head_dim]`` (``state_output``'s layout; ``None``: the skip
    alone). ``rows`` are positions and ``heads`` head indices (``None``: all), LongTensors. Returns
    the head outputs' layout at them, ``[batch, len(rows), len(heads), head_dim]``. A state in the
    cache's ``[head_dim, state_dim]`` layout raises on the product, or, when the two are equal, reads
    silently wrong: transpose it first.
    """
    device = hidden_states.device
    batch, _, num_heads, head_dim = hidden_states.shape
    rows = rows.to(device)
    heads = torch.arange(num_heads, device=device) if heads is None else heads.to(device)
    outputs = hidden_states.new_zeros((batch, len(rows), len(heads), head_dim), dtype=torch.float32)
    if D is not None:
        outputs += D.float()[heads, None] * hidden_states[:, rows][:, :, heads].float()
    if state is not None:
        queries = C[:, rows][:, :, heads // (num_heads // C.shape[2])].float()  # each head its group's C
        outputs += torch.einsum("brhn,bhnp->brhp", queries, state[:, heads].float())
    return outputs


def _row_blocks(rows: Tensor, most: int) -> list[Tensor]:
    """The indices of ``rows`` in blocks of at most ``most``, each block's positions within ``WINDOW`` tokens of its
    first, in position order: what ``_decays_to_rows`` computes at once."""
    order = rows.argsort()
    positions = rows[order].tolist()
    blocks, start = [], 0
    for index, position in enumerate(positions):
        if index - start == most or position - positions[start] >= WINDOW:
            blocks.append(order[start:index])
            start = index
    return blocks + [order[start:]] if positions else blocks


def _runs(groups: list[int]) -> list[tuple[slice, int]]:
    """The asked heads in runs of consecutive ones that read the same group: ``(heads, group)``."""
    runs, start = [], 0
    for index in range(1, len(groups) + 1):
        if index == len(groups) or groups[index] != groups[start]:
            runs.append((slice(start, index), groups[start]))
            start = index
    return runs


def _decays_through(log_decay: Tensor, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The decays from each token to each of a block's rows, through the block's first row: writes, reads, window.

    ``log_decay`` is ``[batch, heads, tokens]`` (every term non-positive) up to the block's last
    row, and ``rows`` the block's positions less its first, ``anchor``, all within ``WINDOW``
    tokens. A token ``j`` up to the anchor decays to a row ``t`` by ``exp(a_{j+1} + ... +
    a_anchor) exp(a_{anchor+1} + ... + a_t)``: its write factor ``[batch, heads, anchor + 1]``
    times the row's read factor ``[batch, heads, rows]``, each an ``exp`` of one sum taken from the
    anchor (backwards for the writes), so both are exact to float32 whatever the call's length,
    and an entry costs a product, not an ``exp``. A token after the anchor decays by ``exp``
    of the difference of two sums of at most ``WINDOW`` terms from the anchor: the window
    ``[batch, heads, rows, tokens after the anchor]``, 0 past each row.
    """
    anchor = log_decay.shape[-1] - 1 - int(rows.max())
    writes = _decay(F.pad(log_decay[..., 1 : anchor + 1].flip(-1).cumsum(-1).flip(-1), (0, 1)))
    level = F.pad(log_decay[..., anchor + 1 :].cumsum(-1), (1, 0))  # from the anchor: [batch, heads, 1 + window]
    reads = _decay(level[..., rows])
    # positive past a row, where it can overflow to inf: replaced by 0 after the exp, never multiplied
    window = _decay(level[..., rows, None] - level[..., None, 1:])
    tokens = torch.arange(1, level.shape[-1], device=rows.device)
    return writes, reads, window.masked_fill_(tokens > rows[:, None], 0)


def _decay(exponent: Tensor) -> Tensor:
    """``exp`` of ``exponent`` in place, each entry first raised to ``SMALLEST_EXPONENT``.

    Below it ``exp`` is (or nears) a subnormal number, which a CPU computes many times slower than a
    normal one; the entry it gives instead, ``1.6e-38``, is as far below float32's resolution of any
    sum it enters as the true one.
    """
    return exponent.clamp_min_(SMALLEST_EXPONENT).exp_()
