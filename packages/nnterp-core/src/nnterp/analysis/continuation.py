"""Running a prompt's later tokens from the cache a run of its first tokens left, as ``generate`` does.

An analysis that changes a prompt only from token ``t`` on (``knockout``, ``patch_state``) need not
run the tokens before ``t`` again for every change: one run of them leaves a cache (recurrent state,
conv state, keys and values), and each changed run continues from a copy of it, ``expanded`` to its
rows. A recurrent mixer whose prompt kernel starts from zeros (Mamba-1's scan) is told what its call
continues from (``RecurrentMixer.continue_from``), so the continuation is one call, not a token at a
time.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, NamedTuple

import nnsight
import torch

from ..components.call_site import CACHE_ARGUMENTS
from ..components.per_token import ChunkBoundaries
from .blocks import Mixers, mixers, recurrent_mixers


class Prefix(NamedTuple):
    """What a run of a prompt's first ``length`` tokens leaves for the runs that continue it: one row each."""

    length: int
    #: the cache the forward returned
    cache: Any
    #: the state after the prefix of each recurrent mixer whose prompt kernel starts from zeros, by block
    states: dict[int, torch.Tensor]


class Segments(NamedTuple):
    """A prompt run in consecutive calls (``run_in_segments``): its logits, and what each call left, by where it
    stopped."""

    logits: torch.Tensor
    prefixes: dict[int, Prefix]


def continues_several_tokens(blocks: list[Mixers]) -> bool:
    """Whether every recurrent mixer of ``blocks`` can run a call of several tokens over a cache
    (``RecurrentMixer.prompt_continues_from_cache``)."""
    return all(block.recurrent is None or type(block.recurrent).prompt_continues_from_cache() for block in blocks)


def starts_from_zeros(blocks: list[Mixers]) -> list[Mixers]:
    """The blocks of ``blocks`` whose recurrent mixer's prompt kernel takes no entering state."""
    return [
        block for block in blocks if block.recurrent is not None and type(block.recurrent).prompt_starts_from_zeros()
    ]


def run_in_segments(model: Any, ids: torch.Tensor, starts: list[int], blocks: list[Mixers]) -> Segments | None:
    """Run ``ids`` ([1, seq]) as consecutive calls split at ``starts`` (ascending, each inside the prompt), each
    continuing from the cache the one before left; ``blocks`` are all the model's.

    One pass over the prompt gives its logits and the ``Prefix`` each start
    needs (and the whole prompt's, under its length), so runs continuing
    from many starts cost one run of the prompt between them. ``None`` where the cache does not count the tokens it
    holds (``counts_every_token``): the caller runs whole prompts instead.
    Without gradients: a cache is copied for each continuation, and torch
    copies only tensors that autograd has not recorded.
    """
    bounds = [0, *starts, ids.shape[1]]
    logits: list[torch.Tensor] = []
    prefixes: dict[int, Prefix] = {}
    prefix = None
    recurrent = recurrent_mixers(blocks)
    for start, stop in zip(bounds, bounds[1:], strict=False):
        inputs = {"use_cache": True} if prefix is None else continuation_inputs(model, prefix.cache, blocks, 1, stop)
        states: dict[int, torch.Tensor] = {}
        with (
            torch.no_grad(),
            ChunkBoundaries.fitted(recurrent, stop - start),
            model.trace(ids[:, start:stop], **inputs),
        ):
            for block in blocks:
                if prefix is not None:
                    continue_mixers(prefix, [block], 1)
                if starts_from_zeros([block]):
                    states[block.layer] = block.recurrent.trajectory(positions=-1).save()
            logits.append(model.logits.save())
            cache = nnsight.save(returned_cache(cache_argument(model), model.output))
        prefix = Prefix(stop, cache, states)
        if not counts_every_token(prefix, blocks):
            return None
        # the last call's cache is kept as it is: nothing continues it here
        prefixes[stop] = Prefix(stop, copy.deepcopy(cache) if stop < ids.shape[1] else cache, states)
    return Segments(torch.cat(logits, dim=1), prefixes)


def counts_every_token(prefix: Prefix, blocks: list[Mixers]) -> bool:
    """Whether the cache counts the tokens it holds, which an attention block's continuation is masked by.

    MiniMax's cache counts at its first block, a lightning block that keeps
    no keys, so it reads 0 and the continuation would be masked short.
    """
    if not any(block.attention is not None for block in blocks) or not hasattr(prefix.cache, "get_seq_length"):
        return True
    return int(prefix.cache.get_seq_length()) == prefix.length


def expanded(cache: Any, rows: int) -> Any:
    """A copy of ``cache`` (one row) with ``rows`` rows, the original left as it was for the next continuation.

    A cache class with its own ``batch_repeat_interleave`` (MiniMax's, for
    its lightning states) knows its tensors; the unified caches' linear
    attention layers repeat only through ``reorder_cache``, whose ``index_select`` is given int32 indices: with
    int64 ones torch's CPU kernel is 20 to 30 times slower on a state of more than two axes (125 ms for
    Mamba-2's state repeated to 16 rows, 4 ms with int32).
    """
    copied = copy.deepcopy(cache)
    own_repeat = type(copied).__dict__.get("batch_repeat_interleave")
    if own_repeat is not None:
        own_repeat(copied, rows)
    else:
        copied.reorder_cache(torch.zeros(rows, dtype=torch.int32))
    return copied


def continue_mixers(prefix: Prefix, blocks: list[Mixers], rows: int) -> None:
    """Inside a continuation's trace: tell each mixer whose prompt kernel starts from zeros what it continues from
    (on a decode step the kernel reads the cache's state, and ``continue_from`` does nothing)."""
    for block in starts_from_zeros(blocks):
        block.recurrent.continue_from(prefix.states[block.layer].expand(rows, *prefix.states[block.layer].shape[1:]))


def continuation_inputs(model: Any, cache: Any, blocks: list[Mixers], rows: int, seen: int) -> dict[str, Any]:
    """The keyword arguments of a continuation's trace of ``rows`` rows over ``cache`` (``expanded`` to them).

    nnsight masks only the tokens it is given; over a cache an attention's
    mask must cover the cached ones too (``seen`` tokens in all), while a
    Mamba's forward masks its input with it and wants the given tokens' only.
    """
    inputs = {"use_cache": True, cache_argument(model): cache}
    if any(block.attention is not None for block in blocks):
        inputs["attention_mask"] = torch.ones(rows, seen, dtype=torch.long)
    return inputs


def returned_cache(name: str, output: Any) -> Any:
    """The cache a forward returned: under ``name``, the name the model's forward takes it by (older names warn on
    5.23+), or another of ``CACHE_ARGUMENTS``."""
    names = (name, *(other for other in CACHE_ARGUMENTS if other != name))
    return next(getattr(output, other) for other in names if getattr(output, other, None) is not None)


def cache_argument(model: Any) -> str:
    """The name the model's forward takes its cache by: one of transformers' cache names, or the one its recurrent
    mixers' kind declares (``RecurrentMixer.CARRIER``: RWKV's ``state``)."""
    accepted = inspect.signature(model._module.forward).parameters
    declared = {type(block.recurrent).CARRIER for block in mixers(model) if block.recurrent is not None}
    return next(name for name in (*CACHE_ARGUMENTS, *sorted(declared - {None})) if name in accepted)
