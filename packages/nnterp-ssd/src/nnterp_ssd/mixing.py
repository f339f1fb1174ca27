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
The rows are computed in blocks, each only up to its last row's token; ``C . B`` is one matrix
product per group, so no ``[rows, tokens, state_dim]`` product and no per-token state is ever
formed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nnterp.analysis.mixing import TokenMixing

from .trajectory import step_sizes

#: Entries of one block of rows' ``[batch, heads, rows, tokens]`` temporaries (a few live at once, float32).
BLOCK_ELEMENTS = 1 << 24
#: The most tokens between a block's rows, so the running sums they subtract hold few terms (``_decays_to_rows``).
WINDOW = 64


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

    matrix = hidden_states.new_zeros((batch, len(heads), len(rows), seq), dtype=torch.float32)
    block_rows = max(1, BLOCK_ELEMENTS // max(1, batch * len(heads) * end))
    for block in _row_blocks(rows, block_rows):
        block_end = int(rows[block].max()) + 1
        scores = (queries[:, :, block] @ keys[:, :, :block_end].transpose(-1, -2))[:, group_of_head]
        scores *= _decays_to_rows(log_decay[..., :block_end], rows[block])
        scores *= step[:, :, None, :block_end]
        matrix[:, :, block, :block_end] = scores

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


def _decays_to_rows(log_decay: Tensor, rows: Tensor) -> Tensor:
    """``exp(a_{j+1} + ... + a_t)`` for each row ``t`` and token ``j <= t``, 0 for ``j > t``: ``[batch, heads, rows, tokens]``.

    ``log_decay`` is ``[batch, heads, tokens]``, every term non-positive, and ``rows`` lie within
    ``WINDOW`` tokens of the first, ``anchor``. Each exponent is ``level[t] - level[j]`` with
    ``level`` the running sum from ``anchor``: forwards after it, backwards (negated) before it. A
    token before ``anchor`` then adds two sums of one sign, with nothing to cancel, and one after it
    subtracts two sums of at most ``WINDOW`` terms, so every exponent is exact to float32 whatever
    the call's length, at one subtraction and one ``exp`` per entry.
    """
    anchor = int(rows.min())
    tokens = torch.arange(log_decay.shape[-1], device=log_decay.device)
    before = -log_decay[..., 1 : anchor + 1].flip(-1).cumsum(-1).flip(-1)
    after = log_decay[..., anchor + 1 :].cumsum(-1)
    level = torch.cat([before, torch.zeros_like(log_decay[..., :1]), after], dim=-1)
    exponent = level[..., rows, None] - level[..., None, :]
    exponent.masked_fill_(tokens > rows[:, None], float("-inf"))
    return exponent.exp_()
