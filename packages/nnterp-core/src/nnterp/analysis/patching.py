"""State patching: run a target prompt on from the state a source prompt left after a token.

Everything a recurrent mixer carries past token ``t`` is its state after ``t``; an attention
block's is its keys and values up to ``t``. ``patch_state`` puts the source's in their place in
the target's run and lets the target continue. The target's tokens up to ``t`` run with the
cache; the state they leave is replaced, as the cache receives it (``state_output``), by the
source's state after ``t`` (``trajectory(positions=t)``, computed from the source's kernel calls,
so no routing is needed); and the target's later tokens run over that cache, the attention blocks
reading the source's keys and values for tokens up to ``t``. Token ``t`` itself reads the state
after it, so its output in each patched recurrent mixer is the patched state's answer to its
query (``read_state``), as with ``set_state_after(t, ...)`` in one run; in an attention block it
is the target's own, the source's keys and values reaching the later tokens. A family whose
prompt kernel cannot start from a cached state (Mamba-1's scan starts from zeros) continues one
token at a time, as ``generate`` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import nnsight
import torch

from ..descriptor import Unavailable
from .blocks import Mixers, mixers, token_ids, within
from .continuation import (
    Prefix,
    cache_argument,
    continuation_inputs,
    continue_mixers,
    continues_several_tokens,
    counts_every_token,
    returned_cache,
)
from .knockout import Metric, last_logits, metric_of_run


def patch_state(
    model: Any,
    source: str | torch.Tensor,
    target: str | torch.Tensor,
    positions: Iterable[int],
    layers: Iterable[int] | None = None,
    heads: Any = None,
    metric: Metric = last_logits,
    max_new_tokens: int = 0,
) -> torch.Tensor:
    """How the target's ``metric`` changes when each block continues from the source's state after each of ``positions``.

    ``[positions, ...metric's axes]``: per position ``t``,
    ``metric(patched) - metric(target as it is)``, float32, where ``metric``
    reduces the target's logits ``[1, seq, vocab_size]`` to ``[1, ...]``
    (default: the last position's logits), the results concatenated along
    that first axis as ``knockout``'s are; the logits before ``t`` are the
    target's own. ``layers`` picks the blocks patched (default: all),
    ``heads`` the heads of each recurrent state patched (as
    ``state[:, heads]``; default: all); an attention block's keys and values
    are patched whole. Positions count from the target's start, and the
    source needs a token at each. With ``max_new_tokens`` the target goes on
    greedily for that many tokens (the patched run from its patched cache,
    the attention blocks reading the source's keys and values on every step)
    and ``metric`` gets each step's next-token logits, as ``knockout``'s does.

    Raises:
        IndexError: a position with no source token at it, or, without
            ``max_new_tokens``, no target token after it.
        nnterp.Unavailable: a chosen block's mixer kind carries more past a
            token than its state (``RecurrentMixer.STATE_PATCHING`` says what),
            before anything runs.
    """
    source_ids, target_ids = token_ids(model, source), token_ids(model, target)
    seq = target_ids.shape[1]
    chosen = [position % seq for position in within(positions, seq, "positions", "tokens of the target")]
    last = seq if max_new_tokens else seq - 1
    late = [position for position in chosen if position >= min(last, source_ids.shape[1])]
    if late:
        raise IndexError(
            f"positions {late}: patching after token t needs a source token at t (the source has "
            f"{source_ids.shape[1]}) and, without max_new_tokens, a target token after t (the target has {seq})"
        )
    blocks, every = mixers(model, layers), mixers(model)
    for block in blocks:
        reason = block.recurrent is not None and type(block.recurrent).STATE_PATCHING
        if reason:
            raise Unavailable(f"patch_state at layers[{block.layer}]: {reason}")
    clean = metric_of_run(model, target_ids, metric, max_new_tokens, lambda: None)
    changes = []
    for position in chosen:
        carried = _carried(model, blocks, source_ids, position)
        index = slice(None) if heads is None else heads
        patched = _continued(model, blocks, every, target_ids, position, carried, index, max_new_tokens)
        changes.append(metric(patched).float() - clean)
    return torch.cat(changes).detach()


class Carried(NamedTuple):
    """What one block carries past a token: its recurrent state, its attention's keys and values (``None`` without)."""

    state: torch.Tensor | None
    keys: torch.Tensor | None
    values: torch.Tensor | None


def _carried(model: Any, blocks: list[Mixers], ids: torch.Tensor, position: int) -> dict[int, Carried]:
    """What each block carries past ``position`` on ``ids``."""
    carried: dict[int, Carried] = {}
    with model.trace(ids[:, : position + 1]):
        for block in blocks:
            state = None if block.recurrent is None else block.recurrent.trajectory(positions=-1).save()
            keys = values = None
            if block.attention is not None:
                keys = block.attention.attention_keys.save()
                values = block.attention.attention_values.save()
            carried[block.layer] = Carried(state, keys, values)
    return carried


def _continued(
    model: Any,
    blocks: list[Mixers],
    every: list[Mixers],
    ids: torch.Tensor,
    position: int,
    carried: dict[int, Carried],
    heads: Any,
    max_new_tokens: int,
) -> torch.Tensor:
    """The target's logits ``[1, seq, vocab_size]``, its tokens after ``position`` continuing from ``carried`` in
    ``blocks`` (``every`` holds all the model's blocks); with ``max_new_tokens``, the next token's logits at each of
    that many greedy steps, ``[1, max_new_tokens, vocab_size]``."""
    split = position + 1
    patched = {block.layer for block in blocks}
    logits: list[torch.Tensor] = []
    entering: dict[int, torch.Tensor] = {}
    with model.trace(ids[:, :split], use_cache=True):
        for block in every:
            mixer = block.recurrent
            if mixer is None or not (block.layer in patched or type(mixer).prompt_starts_from_zeros()):
                continue
            # computed from the call's arguments: state_output itself comes after the head outputs are written
            state = mixer.trajectory(positions=-1)
            if block.layer in patched:
                outputs = mixer.attention_head_outputs
                state = state.clone()
                state[:, heads] = carried[block.layer].state.to(state)[:, heads]
                # token t reads the state after itself: its output is the patched state's answer
                answered = outputs.clone()
                answered[:, -1] = mixer.read_state(state, positions=-1).to(outputs)
                mixer.attention_head_outputs = answered
                mixer.state_output = state
            if type(mixer).prompt_starts_from_zeros():
                # what a continuation of several tokens is told it continues from
                entering[block.layer] = state.save()
        logits.append(model.logits.save())
        cache = nnsight.save(returned_cache(cache_argument(model), model.output))
    prefix = Prefix(split, cache, entering)
    if not counts_every_token(prefix, every):
        raise Unavailable(
            f"patch_state: {type(cache).__name__} counts {int(cache.get_seq_length())} of the {split} tokens it holds "
            f"(it counts at a block that keeps no keys, such as MiniMax's lightning blocks), so the attention blocks' "
            f"continuation would be masked short; patch a model whose first block is an attention, or write "
            f"set_state_after(t, value) with the source's state_after(t) in one run"
        )
    seq = ids.shape[1]
    # every mixer of the model runs the continuation, patched or not
    steps = [slice(split, seq)] if continues_several_tokens(every) else [slice(t, t + 1) for t in range(split, seq)]
    steps = [step for step in steps if step.start < step.stop]
    for step in steps + [None] * max(max_new_tokens - 1, 0):
        tokens = ids[:, step] if step is not None else _next_token(model, logits[-1])
        seen = sum(part.shape[1] for part in logits) + tokens.shape[1]
        with model.trace(tokens, **continuation_inputs(model, cache, every, 1, seen)):
            for block in every:
                continue_mixers(prefix, [block], 1)
                if block.attention is not None and block.layer in patched:
                    source = carried[block.layer]
                    for value, patch in (("attention_keys", source.keys), ("attention_values", source.values)):
                        own = getattr(block.attention, value)
                        replaced = own.clone()
                        replaced[:, :, :split] = patch.to(own)
                        setattr(block.attention, value, replaced)
            logits.append(model.logits.save())
    logits = torch.cat(logits, dim=1)
    # as generate computes them: the next token's logits at each step
    return logits[:, seq - 1 :] if max_new_tokens else logits


def _next_token(model: Any, logits: torch.Tensor) -> torch.Tensor:
    """The greedy next token, ``[1, 1]``, never an end of sequence: ``generate`` with ``min_new_tokens`` set."""
    eos = model._module.generation_config.eos_token_id
    last = logits[:, -1:].clone()
    if eos is not None:
        last[..., torch.as_tensor(eos).reshape(-1)] = float("-inf")
    return last.argmax(-1)
