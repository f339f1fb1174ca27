"""State patching: run a target prompt on from the state a source prompt left after a token.

Everything a recurrent mixer carries past token ``t`` is its state after ``t`` and, where its kind
carries more, further parts (RWKV's token shifts, an mLSTM's normalizer and stabilizer, an RG-LRU's
convolution window: ``RecurrentMixer.carried``); an attention block's is its keys and values up to
``t``. ``patch_state`` puts the source's in their place in the target's run and lets the target
continue. The target's tokens up to ``t`` run with the cache; what they leave is replaced, as the
cache receives it, by what the source's run up to ``t`` left (``RecurrentMixer.carry``; the state
computed from the source's kernel calls, so no routing is needed); and the target's later tokens
run over that cache, the attention blocks reading the source's keys and values for tokens up to
``t``. Token ``t`` itself reads the state after it, so its output in each patched recurrent mixer is
the patched state's answer to its query (``read_state``), as with ``set_state_after(t, ...)`` in
one run; in an attention block it is the target's own, the source's keys and values reaching the
later tokens. A family whose prompt kernel cannot start from a cached state (Mamba-1's scan)
continues one token at a time, as ``generate`` does; so does a model whose cache does not count the
tokens it holds (MiniMax's, counting at a lightning block), each step told its position.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import nnsight
import torch

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
    clean = metric_of_run(model, target_ids, metric, max_new_tokens, lambda: None)
    changes = []
    for position in chosen:
        carried = _carried(model, blocks, source_ids, position)
        index = slice(None) if heads is None else heads
        patched = _continued(model, blocks, every, target_ids, position, carried, index, max_new_tokens)
        changes.append(metric(patched).float() - clean)
    return torch.cat(changes).detach()


class Carried(NamedTuple):
    """What one block carries past a token: its recurrent mixer's parts (``RecurrentMixer.carried``), its
    attention's keys and values (``None`` without)."""

    parts: dict[str, torch.Tensor] | None
    keys: torch.Tensor | None
    values: torch.Tensor | None


def _carried(model: Any, blocks: list[Mixers], ids: torch.Tensor, position: int) -> dict[int, Carried]:
    """What each block carries past ``position`` on ``ids``."""
    carried: dict[int, Carried] = {}
    with model.trace(ids[:, : position + 1]):
        for block in blocks:
            parts = keys = values = None
            for mixer in block.in_forward_order():
                if mixer is block.recurrent:
                    parts = {name: part.save() for name, part in mixer.carried().items()}
                else:
                    keys, values = mixer.attention_keys.save(), mixer.attention_values.save()
            carried[block.layer] = Carried(parts, keys, values)
    return carried


def _fresh_cache(model: Any) -> dict[str, Any]:
    """The cache argument of a run that later runs continue, where a kind says the forward returns none
    (``RecurrentMixer.continuation_cache``); else nothing: the forward makes and returns its own."""
    for block in mixers(model):
        cache = block.recurrent is not None and type(block.recurrent).continuation_cache(model)
        if cache:
            return {"use_cache": True, cache_argument(model): cache}
    return {"use_cache": True}


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
    given = _fresh_cache(model)
    name = cache_argument(model)
    with model.trace(ids[:, :split], **given):
        for block in every:
            mixer = block.recurrent
            if mixer is None or not (block.layer in patched or type(mixer).prompt_starts_from_zeros()):
                continue
            if block.layer in patched:
                state = mixer.carry(carried[block.layer].parts, heads)
            else:
                state = mixer.trajectory(positions=-1)
            if type(mixer).prompt_starts_from_zeros():
                # what a continuation of several tokens is told it continues from
                entering[block.layer] = state.save()
        logits.append(model.logits.save())
        cache = nnsight.save(returned_cache(name, model.output) if name not in given else given[name])
    prefix = Prefix(split, cache, entering)
    # a cache counting fewer tokens than it holds would give the attention blocks too short a mask and the wrong
    # positions over several tokens: one token at a time, each told its position, they are right
    counted = counts_every_token(prefix, every)
    seq = ids.shape[1]
    # every mixer of the model runs the continuation, patched or not
    several = counted and continues_several_tokens(every)
    steps = [slice(split, seq)] if several else [slice(t, t + 1) for t in range(split, seq)]
    steps = [step for step in steps if step.start < step.stop]
    for step in steps + [None] * max(max_new_tokens - 1, 0):
        tokens = ids[:, step] if step is not None else _next_token(model, logits[-1])
        seen = sum(part.shape[1] for part in logits) + tokens.shape[1]
        inputs = continuation_inputs(model, cache, every, 1, seen)
        if not counted:
            inputs["position_ids"] = torch.arange(seen - tokens.shape[1], seen)[None]
        with model.trace(tokens, **inputs):
            for block in every:
                for mixer in block.in_forward_order():
                    if mixer is block.recurrent:
                        continue_mixers(prefix, [block], 1)
                    elif block.layer in patched:
                        _patch_attention(mixer, carried[block.layer], split, seen)
            logits.append(model.logits.save())
    logits = torch.cat(logits, dim=1)
    # as generate computes them: the next token's logits at each step
    return logits[:, seq - 1 :] if max_new_tokens else logits


def _patch_attention(attention: Any, source: Carried, split: int, seen: int) -> None:
    """Inside a continuation's trace, ``seen`` tokens in all: ``source``'s keys and values before token ``split`` in
    place of the attention's cached ones."""
    for value, patch in (("attention_keys", source.keys), ("attention_values", source.values)):
        own = getattr(attention, value)
        # a sliding window's cache keeps only the last keys: its first is token seen - kept
        first = seen - own.shape[2]
        if first < split:
            replaced = own.clone()
            replaced[:, :, : split - first] = patch[:, :, first:].to(own)
            setattr(attention, value, replaced)


def _next_token(model: Any, logits: torch.Tensor) -> torch.Tensor:
    """The greedy next token, ``[1, 1]``, never an end of sequence: ``generate`` with ``min_new_tokens`` set."""
    eos = model._module.generation_config.eos_token_id
    last = logits[:, -1:].clone()
    if eos is not None:
        last[..., torch.as_tensor(eos).reshape(-1)] = float("-inf")
    return last.argmax(-1)
