"""Tensor parallelism: how a rank's piece of a value of a split model is made whole, and put back.

Under transformers' tensor parallelism (``distributed_config=``, one process
per rank) each rank holds a piece of every split projection. nnsight shows
whole tensors at the boundaries of the split modules (its TP envoys), but a
value read inside a forward, at one of its operations, is what this rank
computed there, which is one of three things:

- whole: every rank computed all of it (the residual stream, a mixer whose
  projections gather their output, as Qwen3-Next's gated DeltaNet does);
- a slice: a column-parallel projection split its output, so the rank holds
  ``1 / ranks`` of one axis, contiguous and in rank order (the heads at the
  attention interface, the MLP's activation);
- a term of a sum: inside a module whose output the ranks all-reduce
  (transformers' ``rowwise`` and ``moe_tp_experts`` styles), the rank holds
  its share of the sum (each slot's expert output).

:func:`fragment` says which, from the module styles nnsight recorded and from
the value's layout: an axis whose size on this rank is its size in the model
divided by the ranks is the split one. nnterp then serves the value whole (an
all-gather along that axis, or an all-reduce), and puts what is written back
as this rank's piece (the slice again; or the whole on rank 0 and zeros
elsewhere, which the module's own all-reduce sums to exactly the written
value). While gradients are recorded the model carries on from the whole's
piece, so gradients reach the whole, and through it the model, as in one
process. Reading one is a collective: every rank must read the same values in
the same order, which running the same trace on every rank does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from nnsight.modeling.tp import SIDES, device_mesh, requested_expert_parallel, shard

from .availability import Unavailable
from .layouts import INPUT_AXES, KEY, QUERY
from .order import standard_path

if TYPE_CHECKING:
    from nnsight.intervention.envoy import Envoy

    from .descriptor import EProperty

#: The axes that are positions of the input: every rank holds them whole.
POSITION_AXES = INPUT_AXES | {QUERY, KEY}

UNKNOWN_LAYOUT = (
    "the model is split across {ranks} ranks by tensor parallelism and this value has no layout to say which of "
    "its axes a rank holds a slice of; read it on a model loaded without distributed_config"
)


class SplitValueError(RuntimeError):
    """A value of a split model whose pieces cannot be told apart from its layout."""


@dataclass(frozen=True)
class Fragment:
    """How each rank holds a value of a split model: a slice along ``axis``, or, with ``axis`` ``None``, a term of a sum.

    ``whole`` assembles the value from every rank's piece (a collective);
    ``piece`` is this rank's piece of a whole value, what the model carries on
    with.
    """

    model: Any
    axis: int | None

    def whole(self, local: torch.Tensor) -> torch.Tensor:
        """The value every rank's ``local`` pieces make up: a new tensor, which can be edited in place."""
        group = device_mesh(self.model).get_group()
        if self.axis is None:
            return _Summed.apply(local, group)
        return _Gathered.apply(local, self.axis, group)

    def piece(self, whole: torch.Tensor) -> torch.Tensor:
        """This rank's piece of ``whole``."""
        if self.axis is not None:
            return shard(self.model, whole, dim=self.axis)
        # nnsight's own way back for a term of a sum: the whole on rank 0 and zeros elsewhere, through an autograd
        # function whose backward is the identity on every rank, so the ranks' graphs stay alike.
        from nnsight.modeling.tp.fragments import _fragment_tensor
        from torch.distributed.tensor import Partial

        return _fragment_tensor(whole, device_mesh(self.model), Partial(), False)

    def whole_shape(self, local: torch.Tensor) -> tuple[int, ...]:
        """The shape of the value whose piece on this rank is ``local``."""
        shape = list(local.shape)
        if self.axis is not None:
            shape[self.axis] *= ranks(self.model)
        return tuple(shape)


class _Gathered(torch.autograd.Function):
    """Every rank's slice along ``axis``, concatenated in rank order.

    Each rank computes the same loss from the whole, so a rank's slice gets
    its own part of the whole's gradient: the gradient one process gives.
    """

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, axis: int, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, local.contiguous(), group=group)
        ctx.axis, ctx.start, ctx.size = axis, dist.get_rank(group) * local.shape[axis], local.shape[axis]
        return torch.cat(pieces, dim=axis)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad.narrow(ctx.axis, ctx.start, ctx.size), None, None


class _Summed(torch.autograd.Function):
    """The sum of every rank's term; each term's gradient is the sum's, as for a sum in one process."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        total = local.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def ranks(model: Any) -> int:
    """How many ranks the model envoy ``model`` is split across by tensor parallelism: 1 when it is not.

    Read off the loaded model's device mesh, or, before nnsight loads the
    weights, off the ``distributed_config`` it will load them with.
    """
    mesh = device_mesh(model._module)
    if mesh is not None:
        return mesh.size()
    config = getattr(model, "kwargs", {}).get("distributed_config")
    return getattr(config, "tp_size", None) or 1


def sliced_reason(dims: tuple[str, ...] | None, model: Any) -> str | None:
    """Why a value laid out over ``dims`` is not served on the model envoy ``model``, or ``None``."""
    split = ranks(model)
    if split == 1 or dims is not None:
        return None
    return UNKNOWN_LAYOUT.format(ranks=split)


def fragment(model: Any, location: str, local: Any, sizes: Callable[[], tuple[int | None, ...]]) -> Fragment | None:
    """How the ranks hold the value ``local`` read at ``location``, or ``None`` when it is whole (or not split).

    ``sizes()`` are the value's axis sizes in the model, ``None`` for the
    input's positions (asked only of a split model). A value read inside the forward of a module whose output the
    ranks sum is a term of that sum; otherwise the one axis whose size on this
    rank is ``1 / ranks`` of its size in the model is the split one.

    Raises:
        SplitValueError: the value's shape matches neither (a split of
            several axes, or of one by another factor).
    """
    if not isinstance(local, torch.Tensor) or device_mesh(model._module) is None:
        return None
    if inside_summed_module(model, location):
        return Fragment(model, None)
    count, sizes = ranks(model), sizes()
    split = [axis for axis, size in enumerate(sizes) if size is not None and local.shape[axis] != size]
    if not split:
        return None
    if len(split) > 1 or local.shape[split[0]] * count != sizes[split[0]]:
        raise SplitValueError(
            f"a rank of the {count} holds {tuple(local.shape)} of a value whose model sizes are "
            f"{tuple('*' if size is None else size for size in sizes)}: not one axis split {count} ways"
        )
    return Fragment(model, split[0])


def inside_summed_module(model: Any, location: str) -> bool:
    """Whether ``location`` is an operation inside the forward of a module whose output the ranks all-reduce."""
    styles = getattr(model.interleaver.fragments, "tp_styles", {})
    return any(
        location.startswith(f"{path}.source.") and SIDES.get(style, {}).get("output") == "partial"
        for path, (style, _) in styles.items()
    )


def shim_nnsight(distributed_config: Any) -> None:
    """Give nnsight 0.8 the transformers tensor parallelism it reads, on every transformers of our matrix.

    nnsight finds a module's parallel style with
    ``transformers.distributed.tensor_parallel._get_parameter_plan``.
    transformers 5.23 moved that matcher to ``parallel_utils``; before 5.19 it
    was ``_get_parameter_tp_plan``, the same function under its older name,
    and nnsight refuses those releases outright because their expert
    parallelism and pipeline meshes differ from 5.19's. Tensor parallelism
    alone is applied the same way there (one ``tp`` mesh, a style wrapping
    each module's forward), so for it nnterp lends nnsight the older matcher
    and lifts the refusal; expert parallelism before 5.19 stays refused.
    Remove when nnsight follows.

    Raises:
        ValueError: expert parallelism asked for on transformers before 5.19.
    """
    from transformers.distributed import tensor_parallel

    older = getattr(tensor_parallel, "_get_parameter_tp_plan", None)
    if older is not None:
        if asks_expert_parallel(distributed_config):
            import transformers

            raise ValueError(
                f"expert parallelism (enable_expert_parallel, ep_size) needs transformers 5.19 or later to be traced, and "
                f"{transformers.__version__} is installed: upgrade transformers, or split by tensor parallelism "
                "alone (tp_size)"
            )
        from nnsight.modeling.tp import fragments

        tensor_parallel._get_parameter_plan = older
        fragments._version_checked = True
    elif not hasattr(tensor_parallel, "_get_parameter_plan"):
        from transformers.distributed.parallel_utils import _get_parameter_plan

        tensor_parallel._get_parameter_plan = _get_parameter_plan


def asks_expert_parallel(distributed_config: Any) -> bool:
    """Whether ``distributed_config`` (the dataclass or a dict) asks for expert parallelism, in either spelling.

    ``ep_size`` from transformers 5.19, ``enable_expert_parallel`` before.
    """
    if isinstance(distributed_config, dict):
        flag = distributed_config.get("enable_expert_parallel", False)
    else:
        flag = getattr(distributed_config, "enable_expert_parallel", False)
    return bool(flag) or requested_expert_parallel(distributed_config)


def value_fragment(served: EProperty, obj: Envoy, location: str, local: Any) -> Fragment | None:
    """How the ranks of a model split by tensor parallelism hold ``local``, this value's piece on this rank.

    ``None`` when the value is whole (always, on a model that is not split).
    """
    try:
        return fragment(obj.root, location, local, lambda: model_sizes(served, obj, local))
    except SplitValueError as error:
        raise Unavailable(
            f"{served.name} on {standard_path(obj)}: {error}; read it on a model loaded without distributed_config"
        ) from None


def model_sizes(served: EProperty, obj: Envoy, local: torch.Tensor) -> tuple[int | None, ...]:
    """The value's axis sizes in the model, ``None`` for the positions of the input (and axes no envoy sizes)."""
    from .components.standard import axis_size

    dims = served.dims or ()
    if len(dims) != local.dim():
        raise SplitValueError(f"its layout has {len(dims)} axes and the model's tensor {local.dim()}")

    def size(axis: str) -> int | None:
        if axis in POSITION_AXES:
            return None
        try:
            return axis_size(obj, axis)
        except ValueError:
            return None

    return tuple(size(axis) for axis in dims)
