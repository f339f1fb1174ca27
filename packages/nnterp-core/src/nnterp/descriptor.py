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

The descriptor reads and writes through nnsight's interleaver; the rest of a
value's machinery each has its module: where a path leads and which element of
a call it serves (:mod:`.value_paths`), why a value cannot be served
(:mod:`.availability`), the check of every write against the value's layout
(:mod:`.layout_checks`), the piece of a value a tensor-parallel rank holds
(:mod:`.tensor_parallel`), and what the host envoy answers (:mod:`.value_host`).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from nnsight.intervention.envoy import Envoy
from nnsight.intervention.eproperty import WriteBack, eproperty
from nnsight.intervention.interleaver import Mediator, OutOfOrderError

from . import layouts
from .availability import Unavailable, inside_trace
from .layout_checks import check_layout
from .order import OrderError, passed, standard_path
from .tensor_parallel import sliced_reason, value_fragment
from .value_host import ValueHost
from .value_paths import ARGUMENT_ATTRIBUTES, ArgumentSelection, pick, place, resolve

Reason = "str | Callable[[Envoy], str | None] | None"
Select = "int | str | ArgumentSelection | Callable[[Envoy], int | str | ArgumentSelection | None] | None"


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
        whole = obj.absent()
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
            obj.check_order(self.name)
            value = self._read(obj)
        obj.record_order(self.name)
        return value

    def _read(self, obj: Envoy) -> Any:
        """Wait for the value's place, serve the value, and bind an edited view's write-back (as nnsight's eproperty does).

        Where the element sits in the served container is decided here, at
        read time: the write-back runs when the worker next moves on, maybe
        already pinned to another step, where a key function would answer for
        that step.
        """
        if obj.spans_calls(self):
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
        split = value_fragment(self, obj, location, value)
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
            obj.check_order(self.name)
            if obj.spans_calls(self):
                obj.write_across_calls(self)
            location = self._location(obj)
            self._check_ahead(obj, location)
            raw = Mediator.value(location)
            current = self._serve(obj, raw)
            split = value_fragment(self, obj, location, current)
            if split is None:
                check_layout(self, obj, current, value)
            else:
                check_layout(self, obj, current.new_empty(split.whole_shape(current), device="meta"), value)
                value = split.piece(value)
            if self.shared and split is None and isinstance(current, torch.Tensor):
                current.copy_(value)
                obj.record_order(self.name, written=True)
                return
            if self._postprocess is not None:
                value = self._postprocess(obj, value)
            value = self._whole(obj, pick(self._attribute(obj), self._element(obj), raw), value)
            if self._in_container(obj):
                value = self._place(obj, raw, value)
            Mediator.swap(location, value)
        obj.record_order(self.name, written=True)
        obj.replaced(location, value)

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
        order = obj.order_hint(self.name)
        return f"{self.name} on {standard_path(obj)} was asked for after the forward produced it{detail}; {order}"

    def _check_ahead(self, obj: Envoy, location: str) -> None:
        reached = passed(location)
        if reached is not None:
            raise OrderError(self.order_message(obj, f" (its place has been reached {reached} time(s) in this run)"))

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


def unavailable(reason: str) -> EProperty:
    """A value a family does not have: assign it in the class body in place of the inherited one.

    ``attention_probabilities = unavailable("no softmax: the attention is linear")``
    keeps the name in the repr and in ``support()`` with the reason, and any
    access raises :class:`Unavailable` with it.
    """
    return EProperty(unavailable=reason, description=reason)
