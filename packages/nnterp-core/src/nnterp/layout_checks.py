"""A write checked against its value's layout before it reaches the model.

Every assignment to a standard value passes :func:`check_layout` first: a
tensor of another shape or another kind of number raises ``ValueError``
naming the value, the shape expected with its axes, and how to fix the
call, and the model is left as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from nnsight.intervention.envoy import Envoy

from . import layouts
from .order import standard_path

if TYPE_CHECKING:
    from .descriptor import EProperty


def check_layout(served: EProperty, obj: Envoy, current: Any, value: Any) -> None:
    """Raise ``ValueError`` unless ``value`` has the shape and kind of number of ``current``, the value it replaces.

    Where there is no current tensor (a state a fresh prompt does not
    start from), the layout's model axes are checked instead.
    """
    if isinstance(current, torch.Tensor):
        expected: tuple[int | None, ...] | None = tuple(current.shape)
        kind = number_kind(current)
    else:
        expected, kind = layout_shape(served, obj), "floating point"
        if current is not None or expected is None or value is None:
            return
    where = f"{served.name} on {standard_path(obj)}"
    spelled = "(" + ", ".join("*" if size is None else str(size) for size in expected) + ")"
    axes = f" [{', '.join(served.dims)}]" if served.dims and len(served.dims) == len(expected) else ""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{where}: assign a tensor of shape {spelled}{axes}, not a {type(value).__name__}")
    fits = len(value.shape) == len(expected) and all(
        size is None or size == given for size, given in zip(expected, value.shape, strict=True)
    )
    if not fits:
        raise ValueError(
            f"{where}: expected a tensor of shape {spelled}{axes}, got {tuple(value.shape)}; nothing was "
            f"written (to broadcast, expand it first: value.expand({spelled.strip('()')}))"
        )
    if number_kind(value) != kind:
        raise ValueError(f"{where}: expected {kind} numbers, got a {value.dtype} tensor; nothing was written")


def layout_shape(served: EProperty, obj: Envoy) -> tuple[int | None, ...] | None:
    """The layout's shape on ``obj``: each model axis's size, ``None`` for the input's (batch, seq, images, ...)."""
    from .components.standard import axis_size

    if served.dims is None:
        return None
    try:
        return tuple(None if axis in layouts.INPUT_AXES else axis_size(obj, axis) for axis in served.dims)
    except ValueError:
        return None


def number_kind(tensor: torch.Tensor) -> str:
    """The kind of number a tensor holds: a write must keep it."""
    if tensor.dtype == torch.bool:
        return "boolean"
    if tensor.is_complex():
        return "complex"
    return "floating point" if tensor.is_floating_point() else "integer"
