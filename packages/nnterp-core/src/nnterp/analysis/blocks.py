"""What the analyses ask of a model: its sequence mixers by block, and a prompt as token ids."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..components.layer import ATTENTION, RECURRENT_MIXER

if TYPE_CHECKING:
    from ..components.recurrent import RecurrentMixer


class Mixers(NamedTuple):
    """One block's sequence mixers under their standard names: its recurrent mixer and its attention, either ``None``,
    and whether the attention runs first where it has both (``Layer.attention_first``)."""

    layer: int
    recurrent: "RecurrentMixer | None"
    attention: Any
    attention_first: bool = False

    def in_forward_order(self) -> list[Any]:
        """The block's mixers in the order its forward runs them: inside a trace, what each reads or writes comes in
        this order (tell them apart by ``mixer is block.recurrent``)."""
        present = [mixer for mixer in (self.recurrent, self.attention) if mixer is not None]
        return present[::-1] if self.attention_first else present


def mixers(model: Any, layers: Iterable[int] | None = None) -> list[Mixers]:
    """The sequence mixers of the blocks ``layers`` (default: every block), in forward order; call it outside a trace.

    A hybrid's block has one or the other, Falcon-H1's both. Blocks with
    neither (a block of MLP only) are left out of every block, and refused
    when asked for by name: an analysis would change nothing there.

    Raises:
        IndexError: a layer outside ``model.layers``.
        ValueError: an asked layer has no sequence mixer.
    """
    count = len(model.layers)
    chosen = (
        range(count)
        if layers is None
        else sorted({layer % count for layer in within(layers, count, "layers", "blocks")})
    )
    found = []
    for layer in chosen:
        block = model.layers[layer]
        recurrent, attention = getattr(block, RECURRENT_MIXER, None), getattr(block, ATTENTION, None)
        if recurrent is not None or attention is not None:
            both = recurrent is not None and attention is not None
            found.append(Mixers(layer, recurrent, attention, both and block.attention_first()))
        elif layers is not None:
            raise ValueError(
                f"layers[{layer}] has no sequence mixer (no {RECURRENT_MIXER}, no {ATTENTION}): nothing there reads "
                f"earlier tokens; leave it out of layers"
            )
    return found


def recurrent_mixers(blocks: Iterable[Mixers]) -> list["RecurrentMixer"]:
    """The recurrent mixers of ``blocks``, in forward order: what ``ChunkBoundaries.fitted`` refits."""
    return [block.recurrent for block in blocks if block.recurrent is not None]


def block_indices(model: Any, layers: Iterable[int] | None) -> list[int]:
    """The blocks ``layers`` picks (default: every block), sorted and counted from the start.

    Raises:
        IndexError: a layer outside ``model.layers``.
    """
    count = len(model.layers)
    return sorted(
        {layer % count for layer in within(range(count) if layers is None else layers, count, "layers", "blocks")}
    )


def known(names: Iterable[str], allowed: Iterable[str], does: str) -> tuple[str, ...]:
    """``names`` as a tuple, each one of ``allowed``; ``does`` says what the analysis does with them.

    Raises:
        ValueError: no names, or one not allowed: ``causal_trace restores layer_output, ...; not ['residual']``.
    """
    names, allowed = tuple(names), tuple(allowed)
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        raise ValueError(f"{does} {', '.join(allowed)}; not {unknown or 'nothing'}")
    return names


def within(indices: Iterable[int], count: int, name: str, unit: str) -> list[int]:
    """``indices`` as a list, each checked to index one of ``count`` ``unit`` (negative ones counting back).

    Raises:
        IndexError: naming the ``name`` outside, and the range.
    """
    indices = list(indices)
    outside = [index for index in indices if not -count <= index < count]
    if outside:
        raise IndexError(f"{name} {outside} are outside the {count} {unit} (0 to {count - 1}, or negative)")
    return indices


def token_ids(model: Any, prompt: str | torch.Tensor) -> torch.Tensor:
    """``prompt`` as one row of token ids, ``[1, seq]``: tokenized by the model's tokenizer, or ids as given.

    Raises:
        TypeError: ``prompt`` is neither a string nor one row of integer ids (an analysis runs one prompt,
            repeated as it needs).
    """
    if isinstance(prompt, str):
        return model.tokenizer(prompt, return_tensors="pt").input_ids
    try:
        ids = torch.as_tensor(prompt)
    except (TypeError, ValueError):  # strings in a list, and anything else that is not a tensor of numbers
        ids = None
    if ids is None or ids.is_floating_point() or not (ids.dim() == 1 or (ids.dim() == 2 and ids.shape[0] == 1)):
        raise TypeError(
            f"the prompt must be a string or one row of token ids ([seq] or [1, seq]), not {type(prompt).__name__}"
            + (f" of shape {tuple(ids.shape)}" if ids is not None else "")
            + "; an analysis runs one prompt: loop over prompts, or pass one"
        )
    return ids.reshape(1, -1)
