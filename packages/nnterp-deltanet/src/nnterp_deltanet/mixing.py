"""The delta rule's token mixing: how each output of a gated DeltaNet reads every earlier token's value, exactly.

Per head, token ``t`` moves the state by ``S_t = A_t S_{t-1} + beta_t k_t v_t^T`` with
``A_t = exp(g_t) (I - beta_t k_t k_t^T)`` (after the decay, the delta rule removes what ``k_t``
reads before writing), and reads it with its scaled query: ``o_t = S_t^T q_t``. So
``o_t = sum_{j <= t} M[t, j] v_j + q_t^T A_t ... A_1 S_0`` with the scalar
``M[t, j] = beta_j q_t^T A_t ... A_{j+1} k_j``: the key-removal term is inside ``A``, nothing dropped.

It is computed with the chunked algorithm of ``nnterp_deltanet.trajectory``, fed one-hot values (each
token's value the unit vector of its place in its chunk), so that its UT solve gives, per chunk,
the map from the chunk's values to its corrections, ``T beta``, beside ``W``, which maps the
chunk's start state to what its keys remove. Within a chunk ``c``, with ``Q K^T`` decayed and
causal (``A_qk``)::

    rows of c over columns of c:           A_qk T beta
    a row of c over the start state of c:  Y = exp(G) q - A_qk W
    the start state of c over its end:     Phi_c = exp(G_last) - K_end^T W
    columns of c into the end state of c:  E_c = K_end^T T beta

and row ``t`` of chunk ``c`` reads the columns of an earlier chunk ``c'`` through
``Y_t Phi_{c-1} ... Phi_{c'+1} E_{c'}``. A sweep from the last asked chunk back to the first carries
each asked row's functional ``Y Phi ... Phi`` (``[rows, key_dim]`` per head), so the asked rows cost
two small products per chunk, and what remains at the start is the readout of the entering state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nnterp.analysis import TokenMixing

from .trajectory import _DeltaRule, _ut_system


def delta_rule_mixing(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None,
    rows: Tensor,
    heads: Tensor,
    *,
    use_qk_l2norm: bool,
    chunk_size: int = 64,
) -> TokenMixing:
    """The token mixing of one delta-rule kernel call at ``rows`` and ``heads``, float32.

    The arguments are the kernel's (see ``delta_rule_states``; key heads are
    repeated to the value heads as the kernel does); ``rows`` are sorted,
    distinct positions of the call, ``heads`` value-head indices. The matrix is
    ``[batch, heads, rows, seq]``, zero where a column comes after its row; the
    offset ``[batch, rows, heads, value_dim]`` is the readout of
    ``initial_state`` (``None``: zeros, and so is the offset).
    """
    batch, seq = key.shape[:2]
    value_dim = value.shape[-1]
    matrix = key.new_zeros((batch, len(heads), len(rows), seq), dtype=torch.float32)
    offset = key.new_zeros((batch, len(rows), len(heads), value_dim), dtype=torch.float32)
    if not len(rows):
        return TokenMixing(matrix, offset)
    end = int(rows[-1]) + 1
    repeat = value.shape[-2] // key.shape[2]
    selected = heads.to(key.device)

    def per_value_head(tensor: Tensor) -> Tensor:
        return tensor[:, :end].repeat_interleave(repeat, dim=2)[:, :, selected]

    # One-hot values: the UT solve then gives T beta itself, the map from a chunk's values to its corrections.
    one_hot = torch.eye(chunk_size, device=key.device)[torch.arange(end, device=key.device) % chunk_size]
    one_hot = one_hot[None, :, None].expand(batch, end, len(heads), chunk_size)
    rule = _DeltaRule(
        per_value_head(key),
        one_hot,
        g[:, :end, selected],
        beta[:, :end, selected],
        None,
        use_qk_l2norm,
        chunk_size,
        torch.float32,
    )
    rule.lay_out(end)
    query = rule.in_chunks(reading_queries(per_value_head(query), use_qk_l2norm).transpose(1, 2), 2)
    cumulative = rule.gates.cumsum(dim=3)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=key.device).triu(1)
    decayed_scores = _ut_system(rule.keys, query, cumulative, causal)  # A_qk, the diagonal kept
    within = decayed_scores @ rule.from_zero
    reads_start = query * cumulative.exp() - decayed_scores @ rule.start_read
    into_end = rule.end_keys @ rule.from_zero
    key_dim = query.shape[-1]
    carries = rule.chunk_decay * torch.eye(key_dim, device=key.device) - rule.end_keys @ rule.start_read

    chunk_of, place = (rows // chunk_size).to(key.device), (rows % chunk_size).to(key.device)
    functional = query.new_zeros(batch, len(heads), len(rows), key_dim)
    for chunk in reversed(range(int(chunk_of[-1]) + 1)):
        columns = slice(chunk * chunk_size, min((chunk + 1) * chunk_size, seq))
        width = columns.stop - columns.start
        # rows before this chunk read none of it, and their functional is still zero: only later rows are carried
        later = int(torch.searchsorted(chunk_of, chunk))
        active = functional[:, :, later:]
        matrix[:, :, later:, columns] = (active @ into_end[:, :, chunk])[..., :width]
        functional[:, :, later:] = active @ carries[:, :, chunk]
        inside = (chunk_of == chunk).nonzero().squeeze(-1)
        matrix[:, :, inside, columns] = within[:, :, chunk, place[inside], :width]
        functional[:, :, inside] = reads_start[:, :, chunk, place[inside]]
    if initial_state is not None:
        offset = (functional @ initial_state[:, selected].float()).transpose(1, 2)
    return TokenMixing(matrix, offset)


def delta_rule_readout(query: Tensor, state: Tensor, rows: Tensor, *, use_qk_l2norm: bool) -> Tensor:
    """What the queries at ``rows`` read from ``state``: ``[batch, rows, heads, value_dim]``, float32.

    ``query`` is the kernel's ``[batch, seq, key_heads, key_dim]`` (repeated to
    the state's heads as the kernel does), ``state`` ``[batch, heads,
    key_dim, value_dim]``: the head outputs those tokens would give with
    ``state`` as the state after each of them.
    """
    heads = state.shape[1]
    query = query[:, rows.to(query.device)].repeat_interleave(heads // query.shape[2], dim=2)
    return torch.einsum("bthk,bhkv->bthv", reading_queries(query, use_qk_l2norm), state.float())


def reading_queries(query: Tensor, use_qk_l2norm: bool) -> Tensor:
    """Queries as the kernel reads with them: float32, l2-normalized if it normalizes, scaled by 1/sqrt(key_dim)."""
    query = query.float()
    if use_qk_l2norm:
        query = query * torch.rsqrt((query * query).sum(-1, keepdim=True) + 1e-6)
    return query * query.shape[-1] ** -0.5
