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

import inspect
from collections.abc import Iterable
from typing import Any

import nnsight
import torch

from ..components.kernels import CACHE_ARGUMENTS
from .blocks import Mixers, mixers, token_ids, within
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
    blocks = mixers(model, layers)
    clean = metric_of_run(model, target_ids, metric, max_new_tokens, lambda: None)
    changes = []
    for position in chosen:
        carried = _carried(model, blocks, source_ids, position)
        patched = _continued(
            model, blocks, target_ids, position, carried, slice(None) if heads is None else heads, max_new_tokens
        )
        changes.append(metric(patched).float() - clean)
    return torch.cat(changes).detach()


def _carried(model: Any, blocks: list[Mixers], ids: torch.Tensor, position: int) -> dict[int, Any]:
    """What each block carries past ``position`` on ``ids``: its recurrent state, and its attention's keys and values."""
    carried: dict[int, Any] = {}
    with model.trace(ids[:, : position + 1]):
        for block in blocks:
            if block.recurrent is not None:
                carried[block.layer] = [block.recurrent.trajectory(positions=-1).save()]
            if block.attention is not None:
                keys = block.attention.attention_keys.save()
                values = block.attention.attention_values.save()
                carried.setdefault(block.layer, [None]).extend((keys, values))
    return {layer: (pieces + [None, None])[:3] for layer, pieces in carried.items()}


def _continued(
    model: Any,
    blocks: list[Mixers],
    ids: torch.Tensor,
    position: int,
    carried: dict[int, Any],
    heads: Any,
    max_new_tokens: int,
) -> torch.Tensor:
    """The target's logits ``[1, seq, vocab_size]``, its tokens after ``position`` continuing from ``carried``; with
    ``max_new_tokens``, the next token's logits at each of that many greedy steps, ``[1, max_new_tokens, vocab_size]``."""
    split = position + 1
    logits: list[torch.Tensor] = []
    with model.trace(ids[:, :split], use_cache=True):
        for block in blocks:
            mixer = block.recurrent
            if mixer is not None:
                outputs = mixer.attention_head_outputs
                # computed from the call's arguments: state_output itself comes after the head outputs are written
                own = mixer.trajectory(positions=-1)
                state = own.clone()
                state[:, heads] = carried[block.layer][0].to(own)[:, heads]
                # token t reads the state after itself: its output is the patched state's answer
                answered = outputs.clone()
                answered[:, -1] = mixer.read_state(state, positions=-1).to(outputs)
                mixer.attention_head_outputs = answered
                mixer.state_output = state
        logits.append(model.logits.save())
        cache = nnsight.save(_cache(model, model.output))
    seq = ids.shape[1]
    steps = [slice(split, seq)] if _continues_several_tokens(blocks) else [slice(t, t + 1) for t in range(split, seq)]
    steps = [step for step in steps if step.start < step.stop]
    # nnsight masks only the tokens it is given; over a cache an attention's mask must cover the cached ones too,
    # while a Mamba's forward masks its input with it and wants the given tokens' only
    attends = any(block.attention is not None for block in mixers(model))
    for step in steps + [None] * max(max_new_tokens - 1, 0):
        tokens = ids[:, step] if step is not None else _next_token(model, logits[-1])
        seen = sum(part.shape[1] for part in logits) + tokens.shape[1]
        mask = {"attention_mask": torch.ones(1, seen, dtype=torch.long)} if attends else {}
        with model.trace(tokens, use_cache=True, **mask, **{_cache_argument(model): cache}):
            for block in blocks:
                if block.attention is not None:
                    _, keys, values = carried[block.layer]
                    for name, source in (("attention_keys", keys), ("attention_values", values)):
                        own = getattr(block.attention, name)
                        patched = own.clone()
                        patched[:, :, :split] = source.to(own)
                        setattr(block.attention, name, patched)
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


def _continues_several_tokens(blocks: list[Mixers]) -> bool:
    """Whether every chosen recurrent mixer's prompt kernel starts from the cached state (Mamba-1's does not)."""
    return all(block.recurrent is None or type(block.recurrent).PROMPT.entering_state is not None for block in blocks)


def _cache(model: Any, output: Any) -> Any:
    """The cache a forward returned, under the name the model's forward takes it by (older names warn on 5.23+)."""
    first = _cache_argument(model)
    names = (first, *(name for name in CACHE_ARGUMENTS if name != first))
    return next(getattr(output, name) for name in names if getattr(output, name, None) is not None)


def _cache_argument(model: Any) -> str:
    accepted = inspect.signature(model._module.forward).parameters
    return next(name for name in CACHE_ARGUMENTS if name in accepted)
