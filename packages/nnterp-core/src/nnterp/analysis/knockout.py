"""Knockout: take one token out of what later tokens read, in chosen blocks, and see what changes.

In a recurrent mixer a token reaches later tokens only through what it writes into the state,
and it writes with its key (``beta_t k_t v_t^T`` and the delta rule's removal ``k_t k_t^T S``,
or Mamba's ``dt_t B_t x_t``): with its key at zero it writes nothing and removes nothing, and
the state only decays past it. So ``knock_out`` zeroes the key of the knocked token at the
kernel call (``attention_keys``): everything before it is untouched, the state after it lacks
its write, and every later token, the knocked one's own output included (it reads the state
after itself), continues from that state, on the prompt and through the cache on every step of
``generate``. In an attention block the same removal is an edge knockout: the later queries'
scores on the knocked key are set to ``-inf`` before the softmax (``attention_scores``), so
they renormalize over the other tokens; the knocked token's own row is kept, since with its
own key masked its first token would read nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import torch

from ..components.per_token import TORCH_SCAN_CHUNK, ChunkBoundaries
from .blocks import Mixers, mixers, recurrent_mixers, token_ids, within
from .continuation import (
    Prefix,
    continuation_inputs,
    continue_mixers,
    continues_several_tokens,
    expanded,
    run_in_segments,
)

#: What ``knockout`` compares by default: the logits at the last position, ``[rows, vocab_size]``.
Metric = Callable[[torch.Tensor], torch.Tensor]


def last_logits(logits: torch.Tensor) -> torch.Tensor:
    """The logits at the last position, float32: ``knockout``'s and ``patch_state``'s default metric."""
    return logits[:, -1].float()


def knock_out(
    model: Any, positions: Sequence[int] | torch.Tensor, layers: Iterable[int] | None = None, start: int = 0
) -> None:
    """Inside a trace: in row ``b`` of the batch, remove token ``positions[b]`` from what later tokens read.

    Zeroes that token's key at each chosen block's recurrent mixer
    (``attention_keys``; a mixer kind whose zero key still writes says how
    it removes a token: ``RecurrentMixer.knock_out``) and masks the later queries' scores on it in its
    attention (``attention_scores``); see the module's docstring for what that
    removes. ``positions`` has one entry per row of the traced batch (repeat a
    prompt to knock out several tokens of it at once), each a position of the
    prompt; ``layers`` defaults to every block. In ``generate``, call it on
    every step (``for _ in tracer.iter[:]``): a recurrent mixer's decode step
    already continues from the state without the token, and an attention's
    decode step reads the knocked key from the cache, so it masks it again.
    In a run continuing a prompt from the cache its first ``start`` tokens
    left, ``positions`` still count from the prompt's start, each at or after
    ``start``.

    Raises:
        ValueError: ``positions`` does not have one entry per row.
        nnterp.Unavailable: a chosen mixer cannot serve its keys or scores
            (an optimized kernel, an attention implementation without the
            shared interface), with the fix.
    """
    chosen = torch.as_tensor(positions).reshape(-1)
    for block in mixers(model, layers):
        for mixer in block.in_forward_order():
            if mixer is block.recurrent:
                if not mixer.decoding():
                    mixer.knock_out(chosen - start)
            else:
                _knock_out_of_attention(mixer, chosen, start, f"layers[{block.layer}]")


def _knock_out_of_attention(attention: Any, chosen: torch.Tensor, start: int, where: str) -> None:
    scores = attention.attention_scores
    knocked_tokens(chosen, scores, f"{where}.attention_scores")
    queries, keys = scores.shape[-2:]
    key_position = torch.arange(keys, device=scores.device)
    # a decode step's queries come after the cached keys
    query_position = torch.arange(keys - queries, keys, device=scores.device)
    at = chosen.to(scores.device)[:, None, None, None]
    later_reads = (key_position == at) & (query_position[:, None] > at)
    attention.attention_scores = scores.masked_fill(later_reads, float("-inf"))


def knocked_tokens(positions: torch.Tensor, value: torch.Tensor, where: str) -> torch.Tensor:
    """Which tokens of ``value`` ([batch, seq, ...], read at ``where``) ``positions`` knocks out, one per row:
    ``[batch, seq]`` booleans.

    Raises:
        ValueError: ``positions`` does not have one entry per row of ``value``.
    """
    if len(positions) != value.shape[0]:
        raise ValueError(
            f"knock_out: {len(positions)} position(s) for a batch of {value.shape[0]} at {where}: give one position "
            f"per row of the traced batch"
        )
    return torch.arange(value.shape[1], device=value.device) == positions.to(value.device)[:, None]


def knockout(
    model: Any,
    prompt: str | torch.Tensor,
    positions: Iterable[int],
    layers: Iterable[int] | None = None,
    metric: Metric = last_logits,
    batch_size: int = 8,
    max_new_tokens: int = 0,
) -> torch.Tensor:
    """How knocking out each of ``positions`` changes ``metric``: ``[positions, ...metric's axes]``.

    One run of the prompt as it is, then the prompt once per knocked
    position, ``batch_size`` rows per run, each row knocking out its own
    position in the blocks ``layers`` (``knock_out``). ``metric`` reduces a
    run's logits ``[rows, seq, vocab_size]`` to what is compared (default: the
    last position's logits), inside the trace, on the model's device, so the
    full logits of every row are never kept. The result is
    ``metric(knocked) - metric(as it is)``, float32.

    Nothing before a knocked token changes, so the rows share the prompt's
    start: the knocked positions are taken in order, and each run of rows
    continues from the cache one run of the tokens before its first knocked
    position left (``continuation``), the logits before it being the
    prompt's own. Where a model cannot continue a prompt from its cache, each
    row runs the whole prompt. A chunk scan runs in chunks of at most
    ``TORCH_SCAN_CHUNK`` tokens, the fastest on its pure-torch path, and a
    mixer whose kind computes its call from the arguments faster than its
    pure-torch kernel does so (``RecurrentMixer.run_from_arguments``: Mamba-1's
    scan, continuing from the cached state itself). Without gradients.

    A run's rows all go from its first knocked position, so smaller runs
    repeat fewer tokens, at the cost of more calls. The default of 8 rows
    was the fastest measured on a CPU (``bench/analysis.py``): 64 positions
    of a 256-token prompt in runs of 16 take about 40 forwards of tokens,
    in runs of 8 about 36, and 16 rows of 256 tokens cost a CPU forward more
    per token than 8 rows do (the activations no longer stay in its cache).

    With ``max_new_tokens``, each run is a greedy ``generate`` over the whole
    prompt, knocking out on every step, and ``metric`` gets each step's
    next-token logits, ``[rows, max_new_tokens, vocab_size]``.
    """
    ids = token_ids(model, prompt)
    seq = ids.shape[1]
    knocked = [position % seq for position in within(positions, seq, "positions", "tokens of the prompt")]
    layers = None if layers is None else [block.layer for block in mixers(model, layers)]
    every = mixers(model)
    # knock_out reads the keys inside the kernel, so a chunk scan runs transformers' pure-torch one
    with torch.no_grad(), ChunkBoundaries.fitted(recurrent_mixers(every), seq, TORCH_SCAN_CHUNK):
        shared = None
        if not max_new_tokens and continues_several_tokens(every):
            shared = _knockout_sharing_the_start(model, ids, knocked, layers, metric, batch_size)
        if shared is not None:
            return shared
        clean = metric_of_run(model, ids, metric, max_new_tokens, lambda: None)
        runs = [knocked[start : start + batch_size] for start in range(0, len(knocked), batch_size)]
        changes = [_knocked_run(model, ids, rows, layers, metric, max_new_tokens) - clean for rows in runs]
    return torch.cat(changes).detach()


def _knockout_sharing_the_start(
    model: Any, ids: torch.Tensor, knocked: list[int], layers: list[int] | None, metric: Metric, batch_size: int
) -> torch.Tensor | None:
    """``knockout``'s prompt runs, each continuing from the cache its rows' shared start left; ``None`` where the
    model's cache cannot be continued (``run_in_segments``)."""
    every = mixers(model)
    order = sorted(range(len(knocked)), key=knocked.__getitem__)
    runs = [order[first : first + batch_size] for first in range(0, len(order), batch_size)]
    starts = sorted({knocked[run[0]] for run in runs} - {0})
    segments = run_in_segments(model, ids, starts, every)
    if segments is None:
        return None
    clean = metric(segments.logits).float()
    changes: dict[int, torch.Tensor] = {}
    for run in runs:
        rows = [knocked[index] for index in run]
        prefix = segments.prefixes.get(rows[0])
        if prefix is None:
            changed = _knocked_run(model, ids, rows, layers, metric)
        else:
            changed = _continued_knocked_run(model, ids, rows, layers, metric, prefix, every, segments.logits)
        changes.update(zip(run, changed - clean, strict=True))
    return torch.stack([changes[index] for index in range(len(knocked))]).detach()


def _knocked_run(
    model: Any, ids: torch.Tensor, rows: list[int], layers: list[int] | None, metric: Metric, max_new_tokens: int = 0
) -> torch.Tensor:
    """``metric`` of a run of the whole prompt once per row, each knocking out its own position (``metric_of_run``)."""
    every = mixers(model)
    knocked_layers = {block.layer for block in mixers(model, layers)}
    intervene = (
        partial(knock_out, model, rows, layers)
        if max_new_tokens
        else partial(_knock_out_block_by_block, model, rows, knocked_layers, every)
    )
    return metric_of_run(model, ids.expand(len(rows), -1), metric, max_new_tokens, intervene)


def _knock_out_block_by_block(
    model: Any, rows: list[int], knocked_layers: set[int], every: list[Mixers], prefix: Prefix | None = None
) -> None:
    """Inside a prompt's trace, block by block in forward order: knock out each row's position in ``knocked_layers``,
    then run each recurrent mixer from its arguments where its kind can (``RecurrentMixer.run_from_arguments``),
    from ``prefix``'s state when the trace continues it, or else continue it from ``prefix``."""
    start = 0 if prefix is None else prefix.length
    for block in every:
        # a knocked key is an argument of the call it continues
        if block.layer in knocked_layers:
            knock_out(model, rows, [block.layer], start=start)
        entering = None if prefix is None else prefix.states.get(block.layer)
        if entering is not None:
            entering = entering.expand(len(rows), *entering.shape[1:])
        if block.recurrent is not None and block.recurrent.run_from_arguments(entering) is not None:
            continue
        if prefix is not None:
            continue_mixers(prefix, [block], len(rows))


def _continued_knocked_run(
    model: Any,
    ids: torch.Tensor,
    rows: list[int],
    layers: list[int] | None,
    metric: Metric,
    prefix: Prefix,
    every: list[Mixers],
    clean_logits: torch.Tensor,
) -> torch.Tensor:
    """``metric`` of the prompt's tokens from ``prefix.length`` on, once per row from a copy of the prefix's cache,
    each row knocking out its own position, with the prompt's own logits before them."""
    start, seq = prefix.length, ids.shape[1]
    knocked_layers = {block.layer for block in mixers(model, layers)}
    inputs = continuation_inputs(model, expanded(prefix.cache, len(rows)), every, len(rows), seq)
    read: list[torch.Tensor] = []
    with (
        ChunkBoundaries.fitted(recurrent_mixers(every), seq - start),
        model.trace(ids[:, start:].expand(len(rows), -1), **inputs),
    ):
        _knock_out_block_by_block(model, rows, knocked_layers, every, prefix)
        before = clean_logits[:, :start].expand(len(rows), -1, -1)
        read.append(metric(torch.cat([before.to(model.logits.device), model.logits], dim=1)).float().save())
    return read[0]


def metric_of_run(
    model: Any, ids: torch.Tensor, metric: Metric, max_new_tokens: int, intervene: Callable[[], None]
) -> torch.Tensor:
    """``metric`` of the logits of a run of ``ids``, ``intervene()`` called inside it first (on every step of generate).

    A trace, with ``metric`` applied inside it; or, with ``max_new_tokens``,
    a greedy ``generate``, with ``metric`` applied to each step's next-token
    logits, ``[rows, max_new_tokens, vocab_size]``.
    """
    read: list[torch.Tensor] = []
    if not max_new_tokens:
        with model.trace(ids):
            intervene()
            read.append(metric(model.logits).float().save())
        return read[0]
    steps = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    with model.generate(ids, **steps) as tracer:
        for _ in tracer.iter[:max_new_tokens]:
            intervene()
            read.append(model.logits[:, -1:].save())
    return metric(torch.cat(read, dim=1)).float()
