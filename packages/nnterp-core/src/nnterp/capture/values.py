"""What a capture takes: standard values by name, with a selection and a reduction each, checked against a model.

A value is named as a user reads it, from the model down: ``layers[8].layer_output``,
``layers[4].linear_attn.states``, ``logits``. :func:`plan` resolves every name on
the loaded model before anything runs, so an unknown name, a block index out of
range, a value the checkpoint does not serve or a selection that does not fit the
value's axes fails at once, with what the model does have.

Every captured value is stored one row per token (a value with a sequence axis)
or one row per sequence (a value without one, or a ``mean``), its other axes
after the row axis in the value's own order; ``Read.axes`` names them.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import layouts
from ..components.standard import axis_size
from ..descriptor import EProperty
from ..order import standard_path

#: One step of a value's name: an attribute, with an index when it is a list's entry (``layers[-1]``).
STEP = re.compile(r"([A-Za-z_]\w*)(?:\[(-?\d+)\])?")
#: The axes a ``positions=`` selection indexes: the one axis of a value that runs along the tokens.
TOKEN_AXES = (layouts.SEQ, layouts.QUERY)
#: The axes ``heads=`` indexes, the first a value has.
HEAD_AXES = (layouts.HEADS, layouts.KV_HEADS, layouts.MIXER_HEADS, layouts.CHANNELS)
#: What ``reduce=`` may ask for, computed on the model's device before anything is copied.
REDUCTIONS = ("mean", "norm", "topk")
#: Methods a capture calls with the value's ``positions`` (and ``heads``), instead of reading a value.
METHODS = ("trajectory", "token_mixing")


class CaptureError(ValueError):
    """A capture that cannot run as asked: a value, a selection, a text source or an output directory.

    Raised before any batch runs where it can be known then, else at the shard
    that meets it; the message names what was asked, what the model or the
    source has, and the fix.
    """


@dataclass(frozen=True)
class Value:
    """One standard value to capture, with what to keep of it.

    ``name`` is the value's standard name from the model down
    (``"layers[4].linear_attn.states"``), or a recurrent mixer's method
    ``trajectory`` or ``token_mixing``, which the capture calls with the
    selection (``"layers[4].linear_attn.trajectory"``).

    - ``positions`` picks tokens of each sequence as ``states[:, positions]``
      would, counted over the sequence's own tokens (``-1`` is each sequence's
      last token, however the batch was padded); an int keeps one token row
      per sequence. A sequence shorter than a position (``pack=False``) keeps
      the positions it has.
    - ``heads`` picks entries of the value's heads axis (attention heads, a
      recurrent mixer's heads, or Mamba-1's channels).
    - ``reduce``: ``"mean"`` over the picked tokens of each sequence (one row
      per sequence), ``"norm"`` (the L2 norm over the last axis) or ``"topk"``
      (the ``k`` largest entries of the last axis, with their indices stored
      beside them).
    - ``dtype`` is what is stored (the model's dtype unless given).
    """

    name: str
    positions: int | slice | Sequence[int] | None = None
    heads: int | slice | Sequence[int] | None = None
    reduce: str | None = None
    k: int | None = None
    dtype: torch.dtype | None = None

    @property
    def key(self) -> str:
        """The value's key in the shards and the manifest: its name, and its selection when it has one."""
        options = ", ".join(f"{name}={text}" for name, text in self.selection().items())
        return f"{self.name}({options})" if options else self.name

    def selection(self) -> dict[str, str]:
        """The options that differ from taking the whole value, as text (the manifest records them)."""
        chosen = {"positions": self.positions, "heads": self.heads, "reduce": self.reduce, "k": self.k}
        chosen["dtype"] = str(self.dtype).removeprefix("torch.") if self.dtype is not None else None
        return {name: _spelled(option) for name, option in chosen.items() if option is not None}


def _spelled(option: Any) -> str:
    if isinstance(option, slice):
        parts = (option.start, option.stop) if option.step is None else (option.start, option.stop, option.step)
        return ":".join("" if part is None else str(part) for part in parts)
    return str(list(option) if isinstance(option, (list, tuple, range)) else option)


def as_value(value: str | Value) -> Value:
    """A ``Value`` from its key (a name, or a name and options as ``Value.key`` spells them), or the ``Value`` itself.

    ``"layers[4].linear_attn.states(positions=-1, dtype=float16)"`` is
    ``Value("layers[4].linear_attn.states", positions=-1, dtype=torch.float16)``;
    a slice is spelled ``start:stop:step`` (``positions=-8:``).
    """
    if isinstance(value, Value):
        return value
    name, _, rest = value.partition("(")
    if not rest:
        return Value(name)
    if not rest.endswith(")"):
        raise CaptureError(f"{value!r}: options go in one pair of parentheses at the end, as 'name(positions=-1)'")
    options: dict[str, Any] = {}
    for option in _split_options(rest[:-1]):
        key, equals, text = option.partition("=")
        key = key.strip()
        if not equals or key not in Value.__dataclass_fields__ or key == "name":
            raise CaptureError(f"{value!r}: {option.strip()!r} is not an option; the options are {_OPTIONS}")
        options[key] = _option(key, text.strip(), value)
    return Value(name, **options)


_OPTIONS = "positions, heads, reduce, k and dtype"


def _split_options(text: str) -> list[str]:
    """``text`` split at the commas outside brackets (``positions=[0, 3], heads=1`` is two options)."""
    parts, depth, start = [], 0, 0
    for place, character in enumerate(text):
        depth += {"[": 1, "(": 1, "]": -1, ")": -1}.get(character, 0)
        if character == "," and depth == 0:
            parts.append(text[start:place])
            start = place + 1
    return [part for part in parts + [text[start:]] if part.strip()]


def _option(key: str, text: str, value: str) -> Any:
    if key == "dtype":
        dtype = getattr(torch, text, None)
        if not isinstance(dtype, torch.dtype):
            raise CaptureError(f"{value!r}: dtype={text} is not a torch dtype (float32, float16, bfloat16, ...)")
        return dtype
    if key == "reduce":
        return text
    if ":" in text and key in ("positions", "heads"):
        return slice(*(int(part) if part.strip() else None for part in text.split(":")))
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise CaptureError(f"{value!r}: {key}={text} is not an int, a list of ints or a slice") from None


@dataclass
class Read:
    """A value resolved on a model: where it is read, how its rows are laid out, and how it is selected and reduced."""

    value: Value
    owner: Any
    attribute: str
    #: The value's axes as the model produces it (``("batch", "seq", "hidden_size")``).
    dims: tuple[str, ...]
    method: bool = False
    #: The stored axes, the row axis first: ``("token", "hidden_size")`` or ``("sequence", "mixer_heads", ...)``.
    axes: tuple[str, ...] = field(default=())

    @property
    def per_token(self) -> bool:
        """Whether the stored rows are tokens (else sequences)."""
        return self.axes[0] == "token"

    def describe(self) -> dict[str, Any]:
        """The value's entry in the manifest."""
        return {"name": self.value.name, "axes": list(self.axes), "selection": self.value.selection()}


def plan(model: Any, values: Sequence[str | Value]) -> list[Read]:
    """Resolve every value on ``model`` and check its selection, before anything runs; raises ``CaptureError``."""
    reads = [resolve(model, as_value(value)) for value in values]
    if not reads:
        raise CaptureError("no values to capture: name at least one, as 'layers[0].layer_output'")
    keys = [read.value.key for read in reads]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise CaptureError(f"{', '.join(repeated)} asked for more than once; each value and selection once")
    return reads


def resolve(model: Any, value: Value) -> Read:
    """Find ``value.name`` on the model's standard envoys and check what it asks for against the value's axes."""
    steps = value.name.split(".")
    if not all(STEP.fullmatch(step) for step in steps):
        raise CaptureError(
            f"{value.name!r} is not a standard name: write it as Python reads it from the model, "
            "attributes joined by dots with a list's index in brackets, as 'layers[4].linear_attn.states'"
        )
    owner, path = model, []
    for step in steps[:-1]:
        attribute, index = STEP.fullmatch(step).groups()
        owner = _child(owner, attribute, path, value.name)
        path.append(attribute)
        if index is not None:
            entries = len(owner)
            if not -entries <= int(index) < entries:
                raise CaptureError(
                    f"{value.name}: {'.'.join(path)} has {entries} entries, so [{index}] is out of range "
                    f"(0 to {entries - 1}, or -{entries} to -1 from the end)"
                )
            owner = owner[int(index)]
            path[-1] = f"{attribute}[{index}]"
    attribute, index = STEP.fullmatch(steps[-1]).groups()
    if index is not None:
        raise CaptureError(f"{value.name}: a value is not indexed by its name; select with positions= or heads=")
    read = _read(model, owner, attribute, value)
    _check_selection(read)
    read.axes = _stored_axes(read)
    return read


def _child(owner: Any, attribute: str, path: list[str], name: str) -> Any:
    child = getattr(owner, attribute, None)
    if child is None:
        where = ".".join(path) or "the model"
        children = [name for name, _ in owner._named_children()] if hasattr(owner, "_named_children") else []
        children += list(getattr(owner, "_aliases", {}))
        raise CaptureError(f"{name}: {where} has no module {attribute!r}{_suggest(attribute, children)}")
    return child


def _read(model: Any, owner: Any, attribute: str, value: Value) -> Read:
    where = standard_path(owner) if owner is not model else "the model"
    support = dict(owner.support()) if hasattr(owner, "support") and owner is not model else {}
    definition = inspect.getattr_static(type(owner), attribute, None)
    if attribute in METHODS and callable(definition):
        return Read(value, owner, attribute, _method_dims(owner, attribute), method=True)
    if not isinstance(definition, EProperty):
        known = sorted(name for name in support if "." not in name) + [m for m in METHODS if hasattr(owner, m)]
        raise CaptureError(
            f"{value.name}: {where} serves no value {attribute!r}; its standard values are "
            f"{', '.join(known) or 'none'}{_suggest(attribute, known)}"
        )
    reason = support.get(attribute)
    if reason is not None:
        raise CaptureError(f"{value.name} is not served on this model: {reason}")
    if definition.dims is None:
        raise CaptureError(f"{value.name} has no declared layout, so a capture cannot lay out its rows")
    return Read(value, owner, attribute, tuple(definition.dims))


def _method_dims(owner: Any, attribute: str) -> tuple[str, ...]:
    """The axes ``trajectory`` and ``token_mixing`` return: the states' axes, and per head a row by key matrix."""
    states = inspect.getattr_static(type(owner), "states", None)
    state_dims = tuple(states.dims) if isinstance(states, EProperty) and states.dims else None
    if state_dims is None:
        raise CaptureError(f"{standard_path(owner)}.{attribute}: this mixer declares no states layout")
    if attribute == "trajectory":
        return state_dims
    return (layouts.BATCH, state_dims[2], layouts.QUERY, layouts.KEY)


def _check_selection(read: Read) -> None:
    value, dims = read.value, read.dims
    if value.positions is not None and not any(axis in dims for axis in TOKEN_AXES):
        raise CaptureError(f"{value.name} has no token axis ({', '.join(dims)}), so positions= selects nothing")
    if value.heads is not None and not any(axis in dims for axis in HEAD_AXES):
        raise CaptureError(f"{value.name} has no heads axis ({', '.join(dims)}), so heads= selects nothing")
    if value.heads is not None:
        axis = next(axis for axis in HEAD_AXES if axis in dims)
        count = axis_size(read.owner, axis)
        try:
            torch.arange(count)[indexer(value.heads)]
        except IndexError:
            raise CaptureError(
                f"{value.name}: heads={value.heads!r} reaches outside its {count} {axis} (0 to {count - 1})"
            ) from None
    if value.reduce is not None and value.reduce not in REDUCTIONS:
        raise CaptureError(f"{value.name}: reduce={value.reduce!r}; a capture reduces by {', '.join(REDUCTIONS)}")
    if (value.reduce == "topk") != (value.k is not None):
        raise CaptureError(f"{value.name}: k= goes with reduce='topk' and only with it")
    if value.reduce == "topk" and dims[-1] not in layouts.INPUT_AXES and value.k > axis_size(read.owner, dims[-1]):
        raise CaptureError(
            f"{value.name}: k={value.k} is more than its last axis's {axis_size(read.owner, dims[-1])} {dims[-1]}"
        )
    if value.reduce == "mean" and not any(axis in dims for axis in TOKEN_AXES):
        raise CaptureError(f"{value.name} has no token axis to take the mean over")
    if layouts.BATCH not in dims:
        raise CaptureError(
            f"{value.name} has no batch axis ({', '.join(dims)}): its rows cannot be told apart by sequence, and a "
            "capture takes values with one (a vision tower's values also need images, which a capture's text "
            "sources do not give)"
        )


def indexer(selection: Any) -> Any:
    """A ``heads=`` or ``positions=`` selection as torch indexing takes it (a tuple would index several axes)."""
    return list(selection) if isinstance(selection, (list, tuple, range)) else selection


def _stored_axes(read: Read) -> tuple[str, ...]:
    """The axes a row keeps: the value's axes without batch and its token axis, reduced as asked."""
    value = read.value
    token = next((axis for axis in TOKEN_AXES if axis in read.dims), None)
    rest = [axis for axis in read.dims if axis not in (layouts.BATCH, token)]
    if value.heads is not None and isinstance(value.heads, int):
        rest.remove(next(axis for axis in HEAD_AXES if axis in rest))
    if value.reduce == "norm":
        rest = rest[:-1]
    elif value.reduce == "topk":
        rest = [*rest[:-1], "top_k"]
    per_token = token is not None and value.reduce != "mean"
    return ("token" if per_token else "sequence", *rest)


def _suggest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
