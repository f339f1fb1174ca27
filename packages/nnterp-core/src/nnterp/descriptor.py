"""The descriptor every standard value is declared with.

A standard value is a place in the live model (a module's output, an argument of
an operation inside a forward) that nnsight serves during a trace. ``EProperty``
names that place by a path from the envoy that hosts the value, so one class body
says where each value lives and the same declaration serves every model whose
modules are spelled the same way:

- ``"output"``: the host module's own output (its first tensor when the module
  returns a tuple; an assignment is put back into the tuple).
- ``"inputs"`` with ``select=i`` (or ``select="name"``): one argument of the
  host's forward call.
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

import typing
from collections.abc import Callable
from typing import Any

from nnsight.intervention.envoy import Envoy
from nnsight.intervention.eproperty import eproperty
from nnsight.intervention.interleaver import Mediator
from nnsight.intervention.source import SourceNotAvailable
from nnsight.intervention.util import first_input, replace_first_input

Reason = "str | Callable[[Envoy], str | None] | None"
Select = "int | str | Callable[[Envoy], int | str | None] | None"

#: The attributes a path may end in that serve a call's ``(args, kwargs)``;
#: ``input`` selects the first argument unless ``select`` names another.
ARGUMENT_ATTRIBUTES = ("inputs", "input")


class Unavailable(RuntimeError):
    """A standard value this model does not have, and why.

    Raised on access, before anything runs, so a wrong assumption fails at the
    line that makes it. ``StandardizedTransformer.support`` reports the same
    reasons without raising.
    """


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
        select: One element of the served value: an argument's position or
            keyword name on an ``inputs`` path, a tuple index on ``output``; or a
            function of the envoy returning one. Without it an ``output`` path
            serves the first element of a tuple and ``input`` the first argument.

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
    ) -> None:
        super().__init__(key=None, description=description)
        self.path = key
        self.unavailable = unavailable
        self.select = select
        self._define: Callable | None = None

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
        if self.name is None:
            self.name = name
        if self.path is None:
            self.path = name

    def transform(self, func: Callable) -> "EProperty":
        """Register the write-back of an edited view: ``func(envoy, view, element)`` returns the element to put back."""
        self._transform = lambda obj, view, raw: self._place(obj, raw, func(obj, view, self._pick(obj, raw)))
        return self

    # -- what the value is -------------------------------------------------

    def reason(self, obj: Envoy) -> str | None:
        """Why this value is not available on ``obj``, or ``None`` when it is."""
        if callable(self.unavailable):
            return self.unavailable(obj)
        return self.unavailable

    def key_for(self, obj: Envoy) -> str:
        """The path for ``obj``: the path itself, or what the key function returns for it."""
        return self.path(obj) if callable(self.path) else self.path

    def is_operation(self) -> bool:
        """Whether the value is an operation inside a forward (a key function, or a ``source`` segment)."""
        return callable(self.path) or "source" in str(self.path).split(".")

    @property
    def layout(self) -> Any:
        """The value's shape as a jaxtyping type (``Residual``, ``Pattern``, ...), or ``None``.

        Read off the return annotation of the function that defines the value.
        ``isinstance(tensor, value.layout)`` checks rank and dtype; ``dims``
        names the axes.
        """
        define = self._define
        if define is None:
            return None
        try:
            return typing.get_type_hints(define).get("return")
        except Exception:
            return None

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
        spelled = getattr(self._define, "__annotations__", {}).get("return")
        name = spelled if isinstance(spelled, str) else getattr(spelled, "__name__", "Tensor")
        return f"({self.name}) -> {name} [{', '.join(dims)}]: {self.description}"

    # -- reading and writing -----------------------------------------------

    def _check(self, obj: Envoy) -> None:
        reason = self.reason(obj)
        if reason is not None:
            raise Unavailable(f"{self.name} on {obj.path}: {reason}")
        try:
            Mediator.current(self.name)
        except ValueError:
            raise ValueError(
                f"{self.name} on {obj.path} is a value of the running model: read or write it inside "
                f"`with model.trace(...)` or `with model.generate(...)`"
            ) from None

    def __get__(self, obj: Envoy | None, owner: Any = None) -> Any:
        if obj is None:
            return self
        self._check(obj)
        return super().__get__(obj, owner)

    def __set__(self, obj: Envoy, value: Any) -> None:
        self._check(obj)
        if self._postprocess is not None:
            value = self._postprocess(obj, value)
        location = self._location(obj)
        if self._in_container(obj):
            value = self._place(obj, Mediator.value(location), value)
        Mediator.swap(location, value)
        replaced = getattr(type(obj), "replaced", None)
        if replaced is not None:
            replaced(obj, location, value)

    def _location(self, obj: Envoy) -> str:
        target, attribute = resolve(obj, self.key_for(obj))
        served = getattr(type(target), attribute, None)
        if not isinstance(served, eproperty):
            raise AttributeError(f"{type(target).__name__} serves no {attribute!r}")
        return served._location(target)

    def _attribute(self, obj: Envoy) -> str:
        return self.key_for(obj).rsplit(".", 1)[-1]

    def _element(self, obj: Envoy) -> int | str | None:
        return self.select(obj) if callable(self.select) else self.select

    def _in_container(self, obj: Envoy) -> bool:
        return self._attribute(obj) in ARGUMENT_ATTRIBUTES or self._attribute(obj) == "output"

    def _pick(self, obj: Envoy, raw: Any) -> Any:
        attribute = self._attribute(obj)
        element = self._element(obj)
        if attribute in ARGUMENT_ATTRIBUTES:
            if element is None:
                return first_input(*raw) if attribute == "input" else raw
            args, kwargs = raw
            if isinstance(element, str):
                return kwargs[element]
            return args[element]
        if attribute == "output":
            if isinstance(raw, tuple):
                return raw[0 if element is None else element]
            return raw
        return raw

    def _place(self, obj: Envoy, raw: Any, value: Any) -> Any:
        attribute = self._attribute(obj)
        element = self._element(obj)
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
        return value

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

    def __get__(self, obj: Envoy | None, owner: Any = None) -> Any:
        if obj is None:
            return self
        self._check(obj)
        return self.compute(obj)

    def __set__(self, obj: Envoy, value: Any) -> None:
        raise AttributeError(f"{self.name} is derived and read-only")

    def is_operation(self) -> bool:
        return True


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
