"""The descriptor every standard value is declared with.

A standard value is a place in the live model (a module's output, an argument of
an operation inside a forward) that nnsight serves during a trace. ``EProperty``
names that place by a path from the envoy that hosts the value, so one class body
says where each value lives and the same declaration serves every model whose
modules are spelled the same way:

- ``"output"``: the host module's own output (its first tensor when the module
  returns a tuple; an assignment is put back into the tuple); ``select="name"``
  picks one field of an output that is a mapping (a transformers ``ModelOutput``).
- ``"inputs"`` with ``select=i`` (or ``select="name"``): one argument of the
  host's forward call; an :class:`ArgumentSelection` (a :class:`BoundArgument`
  finds it by the called function's own signature) for one that moves.
- ``"../post_attention_layernorm.output"``: a module named relative to the host.
- ``"/embed_tokens.output"``: a path walked from the model's root.
- ``"source.attention_interface_1.inputs"``: an operation inside the host's
  forward, reached through nnsight's ``.source``; ``.source`` again drills into
  the function that operation calls. An operation inside a called function only
  exists once the call has been drilled into in the current run, so the path is
  walked before every read and write.

A key can also be a function of the envoy returning such a path, for a value
whose place depends on the call (a recurrent mixer's kernel).

A value a checkpoint does not have says so: ``unavailable=`` is a reason, or a
function of the envoy returning one (or ``None``), and any read or write then
raises :class:`Unavailable` with it before the model runs.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from nnsight.intervention.envoy import Envoy
from nnsight.intervention.eproperty import WriteBack, eproperty
from nnsight.intervention.interleaver import Mediator, OutOfOrderError
from nnsight.intervention.source import SourceNotAvailable
from nnsight.intervention.util import first_input, replace_first_input

from . import layouts
from .order import OrderError, passed, standard_path
from .tensor_parallel import POSITION_AXES, Fragment, SplitValueError, fragment, sliced_reason
from .value_host import ValueHost

Reason = "str | Callable[[Envoy], str | None] | None"
Select = "int | str | ArgumentSelection | Callable[[Envoy], int | str | ArgumentSelection | None] | None"

#: The attributes a path may end in that serve a call's ``(args, kwargs)``;
#: ``input`` selects the first argument unless ``select`` names another.
ARGUMENT_ATTRIBUTES = ("inputs", "input")


class ArgumentSelection:
    """An element of a call's ``(args, kwargs)`` that finds itself there: what ``select`` returns for an argument
    that is not at one fixed position or keyword.

    It is decided when the value is read, and its ``place`` is what an edited
    view's write-back uses later, when the worker may have moved on to another
    step: so it holds everything it needs, and asks the envoy nothing.
    """

    def pick(self, arguments: tuple[tuple, dict]) -> Any:
        """The element in the call's ``(args, kwargs)``."""
        raise NotImplementedError

    def place(self, arguments: tuple[tuple, dict], value: Any) -> tuple[tuple, dict]:
        """The call's ``(args, kwargs)`` with ``value`` as the element."""
        raise NotImplementedError


@dataclass(frozen=True)
class BoundArgument(ArgumentSelection):
    """An argument of a call found by the called function's signature, by position or keyword alike.

    For calls whose arguments move between versions of the caller: the
    element is the parameter ``name`` of ``signature``, what the call passed
    for it or the parameter's default, and an assignment rebuilds the call's
    ``(args, kwargs)`` through the bound arguments.
    """

    signature: inspect.Signature
    name: str

    def pick(self, arguments: tuple[tuple, dict]) -> Any:
        """The argument ``name`` of the call ``(args, kwargs)``: as passed, else its default; ``None`` if it has neither."""
        bound = self.signature.bind(*arguments[0], **arguments[1])
        if self.name in bound.arguments:
            return bound.arguments[self.name]
        parameter = self.signature.parameters.get(self.name)
        if parameter is None:
            # passed through the function's **kwargs, if at all
            return bound.kwargs.get(self.name)
        return None if parameter.default is inspect.Parameter.empty else parameter.default

    def place(self, arguments: tuple[tuple, dict], value: Any) -> tuple[tuple, dict]:
        """The call's ``(args, kwargs)`` with ``value`` passed for ``name``; a function without that parameter raises."""
        if self.name not in self.signature.parameters:
            raise TypeError(f"the called function has no parameter {self.name!r} ({self.signature})")
        bound = self.signature.bind(*arguments[0], **arguments[1])
        bound.arguments[self.name] = value
        return bound.args, bound.kwargs


class Unavailable(RuntimeError):
    """A standard value this model does not have, and why.

    Raised on access, before anything runs, so a wrong assumption fails at the
    line that makes it. ``StandardizedTransformer.support`` reports the same
    reasons without raising.
    """


def _rebuilt(kind: type, doc: str | None) -> "EProperty":
    """An empty value descriptor of class ``kind``, for unpickling to fill with its state."""
    descriptor = kind.__new__(kind)
    property.__init__(descriptor, doc=doc)
    return descriptor


class EProperty(eproperty):
    """A served value whose place is a path from the host envoy, and which can say when it is unavailable.

    Args:
        key: Where the value lives, relative to the host: dotted segments ending
            in the served attribute (``output``, ``inputs``, ``input``, or one an
            engine serves), optionally led by ``../`` (the parent) or ``/`` (the
            root); or a function of the envoy returning such a path. Defaults to
            the value's own name, as nnsight's ``eproperty`` does.
        description: The value's line in the model's repr. Defaults to the first
            line of the defining function's docstring.
        unavailable: A reason, or a function of the envoy returning a reason or
            ``None``. A value with a reason raises :class:`Unavailable` on
            access.
        select: One element of the served value: an argument's position,
            keyword name or :class:`ArgumentSelection` on an ``inputs`` path, a
            tuple index on ``output``; or a function of the envoy returning one. Without it an ``output`` path
            serves the first element of a tuple and ``input`` the first argument.
        shared: The forward holds the value's tensor in more than one variable (a pre-norm block's stream is both
            the MLP norm's input and the residual its output is added to), so an assignment is copied into that
            tensor, reaching every holder, rather than replacing it at the one place the value is read.

    Decorate a function to define the value: it receives the served element and
    returns what the user reads (the identity for most values), and its return
    annotation is the value's layout::

        @EProperty("../post_attention_layernorm.output")
        def attention_output(self, value) -> Residual:
            '''What the attention adds to the residual stream.'''
            return value

    Reads, assignments and in-place edits go through nnsight's interleaver as
    ``.output`` does. A view that is not the model's own tensor (a transpose)
    takes a ``transform`` mapping an edited view back, as on ``eproperty``.
    """

    def __init__(
        self,
        key: str | Callable[[Envoy], str] | None = None,
        description: str | None = None,
        unavailable: Reason = None,
        select: Select = None,
        shared: bool = False,
    ) -> None:
        super().__init__(key=None, description=description)
        self.path = key
        self.unavailable = unavailable
        self.select = select
        self.shared = shared
        self._define: Callable | None = None
        self._layout: Any = None

    def __call__(self, define: Callable) -> "EProperty":
        super().__call__(define)
        self._define = define
        self._preprocess = self._serve
        if self.path is None:
            self.path = define.__name__
        if self.description is None and define.__doc__:
            self.description = define.__doc__.strip().splitlines()[0]
        return self

    def __set_name__(self, owner: type, name: str) -> None:
        if not issubclass(owner, ValueHost):
            raise TypeError(
                f"{owner.__name__}.{name}: a standard value is declared on a class that answers its questions; "
                f"derive {owner.__name__} from nnterp.value_host.ValueHost (every Standard envoy is one)"
            )
        if self.name is None:
            self.name = name
        if self.path is None:
            self.path = name

    def transform(self, func: Callable) -> "EProperty":
        """Register the write-back of an edited view: ``func(envoy, view, element)`` returns the element to put back."""
        self._transform = func
        return self

    def __reduce__(self) -> tuple:
        # A remote request that ships nnterp's source (nnterp.remote) pickles the envoy classes by value, and with
        # them their values; a property is not picklable by default, so rebuild it from its docstring and state.
        return _rebuilt, (type(self), self.__doc__), self.__dict__

    # -- what the value is -------------------------------------------------

    def reason(self, obj: Envoy) -> str | None:
        """Why this value is not available on ``obj``, or ``None`` when it is.

        Why the host serves nothing at all first (``Standard.absent``: a vision
        tower no image reaches); then the family's reason; then, on a model
        split by tensor parallelism, a value without a layout, whose rank's
        piece could not be told from the whole (``nnterp.tensor_parallel``).
        """
        whole = type(obj).absent(obj)
        if whole is not None:
            return whole
        own = self.unavailable(obj) if callable(self.unavailable) else self.unavailable
        if own is None and hasattr(self.path, "reason"):
            own = self.path.reason(obj)  # a key found in the installed forward (forward_source.Place)
        return own if own is not None else sliced_reason(self.dims, obj.root)

    def key_for(self, obj: Envoy) -> str:
        """The path for ``obj``: the path itself, or what the key function returns for it."""
        return self.path(obj) if callable(self.path) else self.path

    def is_operation(self) -> bool:
        """Whether the value is an operation inside a forward (a key function, or a ``source`` segment)."""
        return callable(self.path) or "source" in str(self.path).split(".")

    @property
    def layout(self) -> Any:
        """The value's shape as a jaxtyping type (``Residual``, ``Pattern``, ...), or ``None``.

        Read off the return annotation of the function that defines the value;
        a value that can be ``None`` (``State | None``) has the layout it has
        when it is a tensor. ``isinstance(tensor, value.layout)`` checks rank
        and dtype; ``dims`` names the axes.
        """
        define = self._define
        if self._layout is not None or define is None:
            return self._layout
        try:
            hint = typing.get_type_hints(define).get("return")
        except Exception:
            return None
        tensors = [kind for kind in typing.get_args(hint) if kind is not type(None)]
        return tensors[0] if len(tensors) == 1 and len(typing.get_args(hint)) == 2 else hint

    @property
    def dims(self) -> tuple[str, ...] | None:
        """The axis names of ``layout``: ``("batch", "seq", "hidden_size")``."""
        layout = self.layout
        dim_str = getattr(layout, "dim_str", None)
        return tuple(dim_str.split()) if dim_str else None

    def __str__(self) -> str:
        dims = self.dims
        if dims is None:
            return super().__str__()
        if self._layout is not None:
            spelled = next((name for name, layout in vars(layouts).items() if layout is self._layout), None)
        else:
            spelled = getattr(self._define, "__annotations__", {}).get("return")
        name = spelled if isinstance(spelled, str) else getattr(spelled, "__name__", "Tensor")
        return f"({self.name}) -> {name} [{', '.join(dims)}]: {self.description}"

    def laid_out(self, layout: Any, kind: type | None = None) -> "EProperty":
        """This value with another layout, for a subclass whose tensors are shaped its own way.

        ``kind``, an ``EProperty`` subclass, serves it instead where the model's
        tensor needs reshaping into the new layout (``PatchRows``).
        """
        # a property underneath: copy.copy cannot reduce it
        relaid = (kind or type(self)).__new__(kind or type(self))
        relaid.__dict__.update(self.__dict__, _layout=layout)
        return relaid

    # -- reading and writing -----------------------------------------------

    def _check(self, obj: Envoy) -> None:
        reason = self.reason(obj)
        if reason is not None:
            raise Unavailable(f"{self.name} on {standard_path(obj)}: {reason}")
        inside_trace(obj, self.name)

    def __get__(self, obj: Envoy | None, owner: Any = None) -> Any:
        if obj is None:
            return self
        self._check(obj)
        with self.in_order(obj):
            check_order(obj, self.name)
            value = self._read(obj)
        record_order(obj, self.name)
        return value

    def _read(self, obj: Envoy) -> Any:
        """Wait for the value's place, serve the value, and bind an edited view's write-back (as nnsight's eproperty does).

        Where the element sits in the served container is decided here, at
        read time: the write-back runs when the worker next moves on, maybe
        already pinned to another step, where a key function would answer for
        that step.
        """
        if spans_calls(obj, self):
            return obj.read_across_calls(self)
        location = self._location(obj)
        self._check_ahead(obj, location)
        mediator = Mediator.current(location)
        occurrence = mediator.wanted(location)
        waiting = mediator.transform
        if waiting is not None and waiting.key == (self, location, occurrence):
            return waiting.view
        raw = Mediator.value(location)
        attribute, element = self._attribute(obj), self._element(obj)
        value = self._define(obj, self._rows(obj, pick(attribute, element, raw)))
        split = self._fragment(obj, location, value)
        if split is not None:
            whole = split.whole(value)
            version = whole._version

            def write_back_piece() -> Any:
                # The model carries on from the whole when it was edited in place, or when gradients are to reach it.
                if whole._version == version and not whole.requires_grad:
                    return raw
                piece, current = split.piece(whole), pick(attribute, element, raw)
                if self._transform is not None:
                    return place(attribute, element, raw, self._transform(obj, piece, current))
                if self._postprocess is not None:
                    piece = self._postprocess(obj, piece)
                return place(attribute, element, raw, self._whole(obj, current, piece))

            mediator.transform = WriteBack(write_back_piece, whole, self, location, occurrence)
            return whole
        if self._transform is not None:

            def write_back() -> Any:
                return place(attribute, element, raw, self._transform(obj, value, pick(attribute, element, raw)))

            mediator.transform = WriteBack(write_back, value, self, location, occurrence)
        return value

    def __set__(self, obj: Envoy, value: Any) -> None:
        """Check ``value`` against the value's layout at its place, then put it there; the model changes only if it fits."""
        self._check(obj)
        with self.in_order(obj):
            check_order(obj, self.name)
            if spans_calls(obj, self):
                obj.write_across_calls(self)
            location = self._location(obj)
            self._check_ahead(obj, location)
            raw = Mediator.value(location)
            current = self._serve(obj, raw)
            split = self._fragment(obj, location, current)
            if split is None:
                self.check_layout(obj, current, value)
            else:
                self.check_layout(obj, current.new_empty(split.whole_shape(current), device="meta"), value)
                value = split.piece(value)
            if self.shared and split is None and isinstance(current, torch.Tensor):
                current.copy_(value)
                record_order(obj, self.name, written=True)
                return
            if self._postprocess is not None:
                value = self._postprocess(obj, value)
            value = self._whole(obj, pick(self._attribute(obj), self._element(obj), raw), value)
            if self._in_container(obj):
                value = self._place(obj, raw, value)
            Mediator.swap(location, value)
        record_order(obj, self.name, written=True)
        type(obj).replaced(obj, location, value)

    @contextmanager
    def in_order(self, obj: Envoy) -> Iterator[None]:
        """Name this value in an out-of-order error nnsight throws into the worker when the run ends without serving it.

        A request nnsight finds dangling with a ``tracer.iter`` pin is a loop
        that outran the generation, which it warns about; that one is left
        to it.
        """
        try:
            yield
        except OrderError:
            raise
        except OutOfOrderError:
            if Mediator.current(self.name).iteration != 0:
                raise
            raise OrderError(self.order_message(obj)) from None

    def order_message(self, obj: Envoy, detail: str = "") -> str:
        """What an out-of-order request for this value says: the value, the forward's order, the fix."""
        order = type(obj).order_hint(obj, self.name)
        return f"{self.name} on {standard_path(obj)} was asked for after the forward produced it{detail}; {order}"

    def _fragment(self, obj: Envoy, location: str, local: Any) -> Fragment | None:
        """How the ranks of a model split by tensor parallelism hold ``local``, this value's piece on this rank.

        ``None`` when the value is whole (always, on a model that is not split).
        """
        try:
            return fragment(obj.root, location, local, lambda: self._model_sizes(obj, local))
        except SplitValueError as error:
            raise Unavailable(
                f"{self.name} on {standard_path(obj)}: {error}; read it on a model loaded without distributed_config"
            ) from None

    def _model_sizes(self, obj: Envoy, local: torch.Tensor) -> tuple[int | None, ...]:
        """The value's axis sizes in the model, ``None`` for the positions of the input (and axes no envoy sizes)."""
        from .components.standard import axis_size

        dims = self.dims or ()
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

    def _check_ahead(self, obj: Envoy, location: str) -> None:
        reached = passed(location)
        if reached is not None:
            raise OrderError(self.order_message(obj, f" (its place has been reached {reached} time(s) in this run)"))

    def check_layout(self, obj: Envoy, current: Any, value: Any) -> None:
        """Raise ``ValueError`` unless ``value`` has the shape and kind of number of ``current``, the value it replaces.

        Where there is no current tensor (a state a fresh prompt does not
        start from), the layout's model axes are checked instead.
        """
        if isinstance(current, torch.Tensor):
            expected: tuple[int | None, ...] | None = tuple(current.shape)
            kind = number_kind(current)
        else:
            expected, kind = self._layout_shape(obj), "floating point"
            if current is not None or expected is None or value is None:
                return
        where = f"{self.name} on {standard_path(obj)}"
        spelled = "(" + ", ".join("*" if size is None else str(size) for size in expected) + ")"
        axes = f" [{', '.join(self.dims)}]" if self.dims and len(self.dims) == len(expected) else ""
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

    def _layout_shape(self, obj: Envoy) -> tuple[int | None, ...] | None:
        """The layout's shape on ``obj``: each model axis's size, ``None`` for the input's (batch, seq, images, ...)."""
        from .components.standard import axis_size

        if self.dims is None:
            return None
        try:
            return tuple(None if axis in layouts.INPUT_AXES else axis_size(obj, axis) for axis in self.dims)
        except ValueError:
            return None

    def _location(self, obj: Envoy) -> str:
        target, attribute = resolve(obj, self.key_for(obj))
        served = getattr(type(target), attribute, None)
        if not isinstance(served, eproperty):
            raise AttributeError(f"{type(target).__name__} serves no {attribute!r}")
        return served._location(target)

    def _attribute(self, obj: Envoy) -> str:
        return self.key_for(obj).rsplit(".", 1)[-1]

    def _element(self, obj: Envoy) -> int | str | ArgumentSelection | None:
        return self.select(obj) if callable(self.select) else self.select

    def _in_container(self, obj: Envoy) -> bool:
        return self._attribute(obj) in ARGUMENT_ATTRIBUTES or self._attribute(obj) == "output"

    def _pick(self, obj: Envoy, raw: Any) -> Any:
        return self._rows(obj, pick(self._attribute(obj), self._element(obj), raw))

    def _rows(self, obj: Envoy, element: Any) -> Any:
        """What the user is served of the model's element: the element itself, unless a subclass serves part of it."""
        return element

    def _whole(self, obj: Envoy, current: Any, value: Any) -> Any:
        """The element to put in the model for an assigned ``value``: ``value``, unless it is part of ``current``."""
        return value

    def _place(self, obj: Envoy, raw: Any, value: Any) -> Any:
        return place(self._attribute(obj), self._element(obj), raw, value)

    def _serve(self, obj: Envoy, raw: Any) -> Any:
        return self._define(obj, self._pick(obj, raw))


class DerivedEProperty(EProperty):
    """A value computed from other served values rather than read at one place.

    ``compute(envoy)`` runs at read time, inside the trace, and may read any
    number of values. The result is read-only: assigning raises
    ``AttributeError`` (write through whatever the host offers instead).
    """

    def __init__(
        self, compute: Callable[[Envoy], Any], description: str | None = None, unavailable: Reason = None
    ) -> None:
        super().__init__(key=None, description=description, unavailable=unavailable)
        self.compute = compute
        self._define = compute
        if self.description is None and compute.__doc__:
            self.description = compute.__doc__.strip().splitlines()[0]

    def _read(self, obj: Envoy) -> Any:
        return self.compute(obj)

    def __set__(self, obj: Envoy, value: Any) -> None:
        raise AttributeError(f"{self.name} is derived and read-only")

    def is_operation(self) -> bool:
        return True


class TokenEProperty(EProperty):
    """A value the model may hold flat over tokens, ``[batch * seq, ...]``, served as this invoke's ``[batch, seq, ...]``.

    A mixture of experts routes tokens, not sequences: its router and experts
    see the block's input flattened to one row per token. The declaration is an
    :class:`EProperty` in every other respect, and its layout is the
    ``[batch, seq, ...]`` one the user reads and writes. A tensor one rank
    below the layout is the flat one:

    - a read serves this invoke's rows of it, unflattened: a view, so an
      in-place edit lands on the model's tensor;
    - an assignment of ``[batch, seq, ...]`` is checked against that view's
      shape, then spliced into the whole flat tensor (the other invokes' rows
      kept), which replaces the model's.

    nnsight narrows a batched tensor to an invoke's rows only when its leading
    axis is the batch; the flat one's is not, so it reaches every invoke whole
    and the rows are found here, from the invoke's row group.
    """

    def _flat(self, element: Any) -> bool:
        return isinstance(element, torch.Tensor) and self.dims is not None and element.dim() == len(self.dims) - 1

    def _rows(self, obj: Envoy, element: Any) -> Any:
        if not self._flat(element):
            return element
        total, start, size = invoke_rows(self.name)
        if element.shape[0] % total:
            raise ValueError(
                f"{self.name} on {standard_path(obj)}: the model holds {element.shape[0]} token rows, which do not "
                f"split into the {total} sequences of the batch"
            )
        return element.unflatten(0, (total, -1)).narrow(0, start, size)

    def _whole(self, obj: Envoy, current: Any, value: Any) -> Any:
        if not self._flat(current):
            return value
        total, start, size = invoke_rows(self.name)
        whole = current.unflatten(0, (total, -1))
        parts = (
            whole.narrow(0, 0, start),
            value.to(current.dtype),
            whole.narrow(0, start + size, total - start - size),
        )
        return torch.cat(parts).flatten(0, 1)


def invoke_rows(what: str) -> tuple[int, int, int]:
    """The running batch's size, and the first row and row count of the invoke asking for ``what``."""
    mediator = Mediator.current(what)
    batcher = mediator.interleaver.batcher if mediator.interleaver is not None else None
    if batcher is None or not batcher.total:
        raise ValueError(f"{what}: no batch is running to split the model's token rows by")
    group = mediator.batch_group
    start, size = (0, batcher.total) if group is None or not batcher.batching else group
    return batcher.total, start, size


def pick(attribute: str, element: int | str | ArgumentSelection | None, raw: Any) -> Any:
    """The element of a served container a value is: one argument of ``(args, kwargs)``, one item of a tuple output."""
    if attribute in ARGUMENT_ATTRIBUTES:
        if isinstance(element, ArgumentSelection):
            return element.pick(raw)
        if element is None:
            return first_input(*raw) if attribute == "input" else raw
        args, kwargs = raw
        if isinstance(element, str):
            return kwargs[element]
        return args[element]
    if attribute == "output":
        if isinstance(raw, tuple):
            return raw[0 if element is None else element]
        if isinstance(element, str):
            return raw[element]
        return raw
    return raw


def place(attribute: str, element: int | str | ArgumentSelection | None, raw: Any, value: Any) -> Any:
    """``raw`` with ``value`` put where :func:`pick` found the element."""
    if attribute in ARGUMENT_ATTRIBUTES and isinstance(element, ArgumentSelection):
        return element.place(raw, value)
    if attribute == "input" and element is None:
        return replace_first_input(*raw, value)
    if attribute in ARGUMENT_ATTRIBUTES and element is not None:
        args, kwargs = raw
        if isinstance(element, str):
            return args, {**kwargs, element: value}
        return (*args[:element], value, *args[element + 1 :]), kwargs
    if attribute == "output" and isinstance(raw, tuple):
        index = 0 if element is None else element
        return (*raw[:index], value, *raw[index + 1 :])
    if attribute == "output" and isinstance(element, str):
        raw[element] = value
        return raw
    return value


def inside_trace(obj: Envoy, what: str) -> None:
    """Raise a ``ValueError`` saying where ``what`` can be used unless a trace is running."""
    try:
        Mediator.current(what)
    except ValueError:
        raise ValueError(
            f"{what} on {standard_path(obj)} is a value of the running model: read or write it inside "
            f"`with model.trace(...)` or `with model.generate(...)`"
        ) from None


def check_order(obj: Envoy, name: str) -> None:
    """Let the host refuse ``name`` now, when its forward has passed the value's place (a recurrent mixer's call)."""
    type(obj).check_order(obj, name)


def spans_calls(obj: Envoy, value: EProperty) -> bool:
    """Whether the host serves ``value`` across several calls its forward makes (a recurrent mixer's kept states)."""
    return type(obj).spans_calls(obj, value)


def record_order(obj: Envoy, name: str, written: bool = False) -> None:
    """Tell the host ``name`` was served (or written), so later requests can be checked against it."""
    type(obj).record_order(obj, name, written)


def number_kind(tensor: torch.Tensor) -> str:
    """The kind of number a tensor holds: a write must keep it."""
    if tensor.dtype == torch.bool:
        return "boolean"
    if tensor.is_complex():
        return "complex"
    return "floating point" if tensor.is_floating_point() else "integer"


def unavailable(reason: str) -> EProperty:
    """A value a family does not have: assign it in the class body in place of the inherited one.

    ``attention_probabilities = unavailable("no softmax: the attention is linear")``
    keeps the name in the repr and in ``support()`` with the reason, and any
    access raises :class:`Unavailable` with it.
    """
    return EProperty(unavailable=reason, description=reason)


def resolve(obj: Envoy, path: str) -> tuple[Any, str]:
    """The object a path leads to from ``obj``, and the attribute it ends in.

    A module the host's block does not have raises :class:`Unavailable` naming
    it; an operation that is not in a forward raises nnsight's
    ``SourceNotAvailable`` naming the ones that are. Both are raised as
    themselves rather than as the ``AttributeError`` a descriptor would
    otherwise turn into "no attribute".
    """
    node: Any = obj
    rest = path
    while rest.startswith("../"):
        node = node.parent
        rest = rest[3:]
    if rest.startswith("/"):
        node = node.root
        rest = rest[1:]
    *steps, attribute = rest.split(".")
    for step in steps:
        try:
            node = getattr(node, step)
        except AttributeError as error:
            if step == "source" or not isinstance(node, Envoy):
                raise SourceNotAvailable(str(error)) from None
            raise Unavailable(f"no {step} module on {node.path}") from None
    return node, attribute
