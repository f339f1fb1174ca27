"""Attribution patching: a first-order estimate of patching every value at every position, from two runs.

Patching the corrupt prompt's value ``a'`` into the clean run at one (layer, position) changes a
metric ``M`` by about ``(a' - a) . dM/da``, the gradient taken on the clean run (Nanda 2023; Kramár
et al. 2024, AtP). One clean forward and backward and one corrupt forward give that estimate for
every value, layer and position at once, where exact patching runs a forward for each.

Values are named as ``support()`` names a block's values, and each is estimated on the blocks that
have it (a hybrid's ``linear_attn`` and ``self_attn`` apart):

- ``"layer_output"``, ``"self_attn.attention_output"``, ``"linear_attn.attention_output"``,
  ``"mlp.mlp_output"``: one number per position, ``[layers, seq]``;
- ``"self_attn.attention_head_outputs"``, ``"linear_attn.attention_head_outputs"``: per head,
  ``[layers, seq, heads]``, before the heads' output projection;
- ``"mlp.mlp_neurons"``: per neuron, ``[layers, seq, intermediate_size]``;
- ``"linear_attn.states"``: a recurrent mixer's state after each token, per head, ``[layers, seq,
  heads]``: ``(corrupt - clean) . dM/dS_t`` summed over a head's state. Patching the state after
  ``t`` (``set_state_after``) moves the metric through the head outputs at ``t`` and later, so its
  gradient is the recurrence's adjoint (``RecurrentMixer.state_gradients``), run backwards from
  the gradient of the head outputs. Both runs' inputs come from their kernel calls' arguments
  (``RecurrentMixer.state_patch_inputs``), so nothing needs routing. On Mamba-2 and a gated
  DeltaNet the product is taken in chunks without forming a state per token, on KDA's
  per-channel decays a chunk of states at a time (``RecurrentMixer.state_patch_estimates``).

The clean run's backward computes the gradients of activations only: the model's parameters are
frozen for it (a weight's gradient would double each linear layer's backward), and after it every
parameter takes a gradient as it did before, holding none from the run.

The clean run's backward runs through each recurrent mixer as its kind says
(``RecurrentMixer.backward_through_adjoint``): on Mamba-1, through the scan's adjoint rather than
autograd's record of transformers' token loop, whose backward is quadratic in the prompt. That
backward forms the clean run's states and their adjoint, so it also estimates the corrupt run's
states (``AdjointRoute.state_patch_estimates``), and the clean run reads nothing for them. A kind
that computes its call from the arguments faster than its pure-torch kernel does so in both runs
(``RecurrentMixer.run_from_arguments``: Mamba-1's scan, about three times faster than transformers'
loop), so their values are the kernel's to rounding.

A value nnsight serves no gradient for (one computed beside the forward rather than used by it:
a mixture of experts' slots, head outputs served as a reshaped copy, as Bloom's) raises ``Unavailable``.
Mamba-1's head outputs take theirs from the tensor its adjoint route writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from nnsight.intervention.interleaver import OutOfOrderError
from torch import Tensor

from ..availability import Unavailable
from ..components.layer import ATTENTION, RECURRENT_MIXER
from ..components.per_token import TORCH_SCAN_CHUNK, ChunkBoundaries
from .blocks import Mixers, block_indices, known, mixers, recurrent_mixers, token_ids

#: What ``attribution_patch`` estimates, in the order a block's forward makes them.
ESTIMATED = (
    "self_attn.attention_head_outputs",
    "self_attn.attention_output",
    "linear_attn.states",
    "linear_attn.attention_head_outputs",
    "linear_attn.attention_output",
    "mlp.mlp_neurons",
    "mlp.mlp_output",
    "layer_output",
)
#: Values estimated per element; every other sums over its last axis (a head's or the stream's width, which a patch
#: moves together), and a state as its kind says (``RecurrentMixer.state_patch_estimates``).
PER_ELEMENT = ("mlp.mlp_neurons",)
#: The recurrent state after each token, estimated through the adjoint of its recurrence.
STATES = "linear_attn.states"
#: A recurrent mixer's head outputs, which the gradient of its states starts from.
HEAD_OUTPUTS = "linear_attn.attention_head_outputs"


class Estimate(NamedTuple):
    """One value's attribution: the blocks that have it, and the estimate ``[len(layers), seq, ...]``."""

    layers: tuple[int, ...]
    scores: Tensor


def answer_log_probability(answer: int) -> Callable[[Tensor], Tensor]:
    """A metric for ``attribution_patch``: the log-probability of ``answer`` at the last position."""

    def metric(logits: Tensor) -> Tensor:
        last = logits[:, -1]
        return last.to(torch.promote_types(last.dtype, torch.float32)).log_softmax(-1)[:, answer].sum()

    return metric


def top_log_probability(logits: Tensor) -> Tensor:
    """``attribution_patch``'s default metric: the log-probability of the run's own most likely next token."""
    last = logits[:, -1]
    last = last.to(torch.promote_types(last.dtype, torch.float32))
    return last.log_softmax(-1).gather(-1, last.detach().argmax(-1, keepdim=True)).sum()


def attribution_patch(
    model: Any,
    clean: str | Tensor,
    corrupt: str | Tensor,
    values: Iterable[str] = ("layer_output",),
    metric: Callable[[Tensor], Tensor] | None = None,
    layers: Iterable[int] | None = None,
) -> dict[str, Estimate]:
    """Estimate, for each value, layer and position, how patching ``corrupt``'s value into ``clean``'s run moves ``metric``.

    Returns ``{value: Estimate}``: the blocks of ``layers`` (default: all)
    that have the value, and the estimate ``[blocks, seq, ...]`` as the
    module says, float32 (NaN past a block's own width where blocks differ in
    it: Gemma 4's MLP neurons). The clean run goes without a cache, its parameters frozen (they take
    gradients after as before, holding none). ``metric`` maps the clean run's logits ``[1, seq,
    vocab_size]`` to a scalar (default: the log-probability of the clean
    run's most likely next token). The prompts must have as many tokens.

    Raises:
        ValueError: an unknown value, or prompts of different lengths, before anything runs.
        nnterp.Unavailable: a value no chosen block has, or one nnsight serves no gradient for.
    """
    clean_ids, corrupt_ids = token_ids(model, clean), token_ids(model, corrupt)
    if clean_ids.shape != corrupt_ids.shape:
        raise ValueError(
            f"attribution_patch: the clean prompt has {clean_ids.shape[1]} tokens and the corrupt one "
            f"{corrupt_ids.shape[1]}; patching moves a value between the same positions, so give prompts as long"
        )
    values = known(values, ESTIMATED, "attribution_patch estimates")
    places = [
        _Place(layer, value, owner)
        for layer in block_indices(model, layers)
        for value in ESTIMATED
        if value in values and (owner := _owner(model, layer, value)) is not None
    ]
    missing = [value for value in values if not any(place.value == value for place in places)]
    if missing:
        raise Unavailable(
            f"attribution_patch: no chosen block serves {', '.join(missing)}; model.support() lists what each has"
        )
    metric = metric or top_log_probability

    groups = _in_forward_order(model, places)
    in_order = [place for _, _, group in groups for place in group]
    scans, seq = recurrent_mixers(mixers(model)), clean_ids.shape[1]
    # a chunk scan's pure-torch path is fastest, forwards and backwards, in chunks of at most TORCH_SCAN_CHUNK tokens
    with torch.no_grad(), ChunkBoundaries.fitted(scans, seq, TORCH_SCAN_CHUNK), model.trace(corrupt_ids):
        for block, owner, group in groups:
            states = next((place for place in group if place.value == STATES), None)
            if states is not None:
                states.corrupt = [tensor.save() for tensor in states.owner.state_patch_inputs()]
            # what it reads of the call are its arguments and head outputs, which a kind's own run returns
            computed = block.recurrent.run_from_arguments() if owner == RECURRENT_MIXER else None
            for place in group:
                if place is states:
                    continue
                served = (
                    computed
                    if place.value == HEAD_OUTPUTS and computed is not None
                    else getattr(place.owner, place.name)
                )
                # a served tensor can be the model's own, which a later write would change
                place.corrupt = served.clone().save()
    try:
        # without a cache: a forward that updates one in place (RWKV's) leaves autograd nothing to run back through
        with (
            ChunkBoundaries.fitted(scans, seq, TORCH_SCAN_CHUNK),
            _gradients_of_activations_only(model._module),
            model.trace(clean_ids, use_cache=False),
        ):
            for block, owner, group in groups:
                states = next((place for place in group if place.value == STATES), None)
                # every recurrent mixer the metric's gradient runs back through, chosen or not
                route = (
                    block.recurrent.backward_through_adjoint(None if states is None else states.corrupt)
                    if owner == RECURRENT_MIXER
                    else None
                )
                for place in group:
                    if place is states and route is not None and route.state_patch_estimates is not None:
                        place.served = route.state_patch_estimates  # the backward estimates it: its gradient
                        continue
                    if place is states:
                        place.clean = [tensor.save() for tensor in place.owner.state_patch_inputs()]
                    if place.value in (STATES, HEAD_OUTPUTS) and route is not None:
                        place.served = route.head_outputs  # the head outputs the forward now goes on with, read once
                    else:
                        # a state's gradient starts from its head outputs'
                        place.served = getattr(
                            place.owner, "attention_head_outputs" if place.value == STATES else place.name
                        )
                    if place.value != STATES:
                        place.clean = place.served.detach().clone().save()
            measured = metric(model.logits)
            with measured.backward():
                for place in reversed(in_order):
                    place.gradient = place.served.grad.save()
    except OutOfOrderError as error:
        # a gradient hook that never fired: the value is a copy read beside the forward, which no gradient reaches
        which = next(
            (place for place in in_order if place.served is not None and str(id(place.served)) in str(error)), None
        )
        raise Unavailable(
            f"attribution_patch: nnsight serves no gradient for "
            f"{', '.join(values) if which is None else f'layers[{which.layer}] {which.value}'}: it is computed beside "
            f"the forward, not a tensor the forward goes on with; estimate the value it is computed from, or patch "
            f"it exactly"
        ) from None
    return {
        value: Estimate(
            tuple(place.layer for place in places if place.value == value),
            _stacked([place.estimate() for place in places if place.value == value]),
        )
        for value in values
    }


def _in_forward_order(model: Any, places: list[_Place]) -> list[tuple[Mixers | None, str | None, list[_Place]]]:
    """``places`` grouped as the forward reaches them: block by block, a group per sequence mixer in the order the
    block runs them (``RECURRENT_MIXER`` or ``ATTENTION``; the recurrent one's even without places, for its backward's
    route), then one of the block's other values (``None``)."""
    blocks = {block.layer: block for block in mixers(model)}
    groups: list[tuple[Mixers | None, str | None, list[_Place]]] = []
    for layer in sorted(blocks.keys() | {place.layer for place in places}):
        block = blocks.get(layer)
        owners = (
            []
            if block is None
            else [RECURRENT_MIXER if mixer is block.recurrent else ATTENTION for mixer in block.in_forward_order()]
        )
        at_layer = [place for place in places if place.layer == layer]
        for owner in owners:
            groups.append((block, owner, [place for place in at_layer if place.value.startswith(f"{owner}.")]))
        groups.append((block, None, [place for place in at_layer if place.value.rpartition(".")[0] not in owners]))
    return groups


@dataclass
class _Place:
    """One value of one block: what each run gives of it, and the metric's gradient with respect to the clean one."""

    layer: int
    value: str
    owner: Any
    #: the corrupt run's value, or for the states what ``state_patch_inputs`` reads
    corrupt: Any = None
    clean: Any = None
    #: the tensor whose gradient is read
    served: Any = None
    gradient: Any = None

    @property
    def name(self) -> str:
        """The value's name on its owner."""
        return self.value.rpartition(".")[2]

    def estimate(self) -> Tensor:
        """The difference of the runs times the gradient, as the module says, for this block: ``[seq, ...]``."""
        if self.value == STATES and self.clean is None:  # estimated by the backward, as its probe's gradient
            return self.gradient[0]
        if self.value == STATES:
            return type(self.owner).state_patch_estimates(tuple(self.clean), tuple(self.corrupt), self.gradient)[0]
        # the corrupt run's copy is this function's own: the difference goes in place
        patch = self.corrupt.sub_(self.clean)
        gradient = self.gradient.to(patch.dtype)
        summed = patch * gradient if self.value in PER_ELEMENT else torch.einsum("...i,...i->...", patch, gradient)
        return summed[0]


@contextmanager
def _gradients_of_activations_only(module: torch.nn.Module) -> Iterator[None]:
    """``module``'s parameters frozen and its input embeddings' output a tensor that takes a gradient, for the block.

    The backward then computes the gradients of the activations the
    estimates need and no weight's: each linear layer's backward does one
    matrix product instead of two, half a backward's cost on a dense model.
    Every parameter that took a gradient takes one again after.
    """
    trainable = [parameter for parameter in module.parameters() if parameter.requires_grad]
    for parameter in trainable:
        parameter.requires_grad_(False)
    hook = module.get_input_embeddings().register_forward_hook(lambda _module, _inputs, output: output.requires_grad_())
    try:
        yield
    finally:
        hook.remove()
        for parameter in trainable:
            parameter.requires_grad_(True)


def _stacked(parts: list[Tensor]) -> Tensor:
    """The blocks' estimates as one float32 tensor, each padded with NaN to the widest (Gemma 4's MLPs are wider on
    some blocks)."""
    widest = [max(sizes) for sizes in zip(*(part.shape for part in parts), strict=True)]
    padding = [[(0, most - size) for most, size in zip(widest, part.shape, strict=True)] for part in parts]
    return torch.stack(
        [
            F.pad(part.float(), [side for pair in reversed(pads) for side in pair], value=float("nan"))
            for part, pads in zip(parts, padding, strict=True)
        ]
    )


def _owner(model: Any, layer: int, value: str) -> Any:
    """The envoy serving ``value`` (a block-relative standard name) on block ``layer``, or ``None`` when it has none.

    Raises:
        nnterp.Unavailable: ``linear_attn.states`` of a mixer kind that declares no gradient of its states.
    """
    owner_name, _, name = value.rpartition(".")
    block = model.layers[layer]
    owner = getattr(block, owner_name, None) if owner_name else block
    if owner is None or name not in dir(type(owner)):
        return None
    if value == STATES and not type(owner).declares_state_gradients():
        raise Unavailable(
            f"attribution_patch: layers[{layer}].linear_attn, a {type(owner).__name__}, does not say how its states' "
            f"gradient runs back through its recurrence (RecurrentMixer.state_gradients); estimate its "
            f"attention_output, or patch its states exactly with set_state_after"
        )
    return owner if owner.unavailable("state_trajectory" if value == STATES else name) is None else None
