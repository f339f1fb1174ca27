"""Where a standard value lives: a path from the envoy hosting it, and the element of what nnsight serves there.

A path is dotted segments ending in the served attribute (``output``,
``inputs``, ``input``), optionally led by ``../`` (the parent) or ``/`` (the
root), with ``source`` segments for an operation inside a forward
(:func:`resolve`). What nnsight serves at a call is ``(args, kwargs)``, and at
an output maybe a tuple or a mapping; :func:`pick` takes a value's element out
of it and :func:`place` puts an assigned one back.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from nnsight.intervention.envoy import Envoy
from nnsight.intervention.source import SourceNotAvailable
from nnsight.intervention.util import first_input, replace_first_input

from .availability import Unavailable

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
