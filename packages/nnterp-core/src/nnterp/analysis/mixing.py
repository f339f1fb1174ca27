"""Token mixing: the exact matrix through which a sequence mixer's outputs read its values.

Every recurrent mixer nnterp serves is linear in its values once its queries, keys and gates
are fixed: per head (per channel on Mamba-1) the state after token ``t`` is
``S_t = A_t S_{t-1} + b_t v_t^T``, with ``A_t`` the token's transition (a decay, and on the delta
rule the removal of what its key reads) and ``b_t`` what it writes with (``beta_t k_t``,
``dt_t B_t``), and the output reads it, ``y_t = S_t^T c_t``. So::

    y_t = sum_{j <= t} M[t, j] v_j  +  c_t^T A_t ... A_1 S_0  (+ the family's skip term, D x_t)
    M[t, j] = c_t^T A_t ... A_{j+1} b_j

``M`` is the mixer's token-to-token matrix, the recurrent counterpart of an attention pattern:
``[batch, heads, query, key]``, one scalar per head and pair of tokens, exact (no term of the
delta rule dropped). What the head outputs hold besides ``M``'s mixing of this call's values, the
readout of the state the call started from and the skip term, is its ``offset``, in the head
outputs' layout. A family computes both from its kernel call's arguments
(``RecurrentMixer.mixing_from_arguments``); this module holds what every family shares: the
selection of rows and heads, and the identity they satisfy.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..positions import Positions, select_indices, select_positions

#: What a ``heads=`` argument may be: one head, a slice, a list, or an index tensor.
Heads = int | slice | list[int] | tuple[int, ...] | Tensor | None


class TokenMixing(NamedTuple):
    """A mixer's token mixing at chosen rows and heads, as a family computes it.

    ``matrix`` is ``[batch, heads, rows, seq]`` (row ``i`` the ``i``-th asked
    position, column ``j`` the call's token ``j``); ``offset`` the rest of the
    head outputs at those rows, in the head outputs' layout restricted to them
    (``[batch, rows, heads, ...]``).
    """

    matrix: Tensor
    offset: Tensor


def select_heads(heads: Heads, count: int) -> tuple[Tensor, bool]:
    """The heads ``heads`` picks among ``count`` as an index tensor, and whether one int was asked (dropping the axis).

    ``heads`` indexes the heads axis as ``tensor[:, heads]`` would.
    """
    needed, order, single = select_indices(heads, count, "heads", f"the mixer's {count} heads", "its heads axis")
    return (needed if order is None else needed[order]), single


def selected_mixing(matrix: Tensor, positions: Positions, heads: Heads) -> Tensor:
    """The rows ``positions`` and heads ``heads`` of a whole ``[batch, heads, query, key]`` matrix (an attention pattern).

    The same selection ``token_mixing`` makes: ``positions`` as
    ``states[:, positions]`` would, ``heads`` as ``matrix[:, heads]`` would,
    an int dropping its axis.
    """
    rows, order, single_row = select_positions(positions, matrix.shape[2])
    chosen, single_head = select_heads(heads, matrix.shape[1])
    asked = rows if order is None else rows[order]
    matrix = matrix[:, chosen.to(matrix.device)][:, :, asked.to(matrix.device)]
    if single_row:
        matrix = matrix[:, :, 0]
    return matrix[:, 0] if single_head else matrix


def mixed(matrix: Tensor, values: Tensor) -> Tensor:
    """``matrix`` applied to ``values``: ``[batch, heads, rows, seq]`` times ``[batch, seq, heads, ...]``.

    The result is in the values' layout with ``rows`` for ``seq``: add the
    ``offset`` and it is the head outputs at those rows.
    """
    return torch.einsum("bhts,bsh...->bth...", matrix.to(values.dtype), values)
