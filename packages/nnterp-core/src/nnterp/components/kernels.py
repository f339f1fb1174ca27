"""The kernel calls a recurrent mixer makes: their declaration, which function a name is bound to, and whether
their values can be read.

transformers' modeling modules call their recurrent kernels through module-level
names, bound by its hub dispatcher to a pure-torch function or an optimized
package's kernel. A mixer declares each call as a :class:`KernelCall` and finds
its arguments by the pure-torch function's signature (:func:`argument`). Values
read inside a kernel need the pure-torch one (:func:`needs_torch_kernels`);
values computed from the call's arguments need only the call
(:func:`needs_kernel_call`).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from nnsight.intervention.source import STATE, decorator_chain

from ..descriptor import BoundArgument

if TYPE_CHECKING:
    from .recurrent import RecurrentMixer

#: Argument names a mixer's forward takes its cache under, across transformers versions.
CACHE_ARGUMENTS = ("cache_params", "cache", "past_key_values")

#: Mixer modules whose forward nnsight has instrumented: route_kernels warns that they keep their kernels.
INSTRUMENTED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()

#: An instrumented forward -> the globals it was compiled over (finding them parses its decorators' source).
_COMPILED_GLOBALS: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


#: The name under which a mixer asks a kernel call for the state the call starts from (``KernelCall.entering_state``).
ENTERING_STATE = "state"


@dataclass(frozen=True)
class KernelCall:
    """One kernel call a recurrent mixer's forward makes: a prompt's, or a decode step's.

    Declared by what the mixer needs of it; the rest is read off the kernel
    itself. Its arguments are found by the pure-torch kernel's own signature
    (:meth:`argument`), so a parameter that moves, or is passed by keyword
    instead of position, in a new transformers release needs no edit, and an
    assigned argument rebuilds the call through the bound arguments.
    """

    #: The call's operation label in the mixer's forward: ``torch_chunk_gated_delta_rule_0``.
    label: str
    #: The kernel's parameter taking the state the call starts from; ``None`` for a kernel that starts from zeros.
    entering_state: str | None = None
    #: Inside the kernel's body, the binding of the state after each token (``None``: the body binds none), or of
    #: every chunk boundary's state where the mixer gets its per-token states from chunk boundaries.
    token_state: str | None = None
    #: The mixer's name for an argument -> this kernel's parameter, where the mixer's two kernels differ.
    renamed: Mapping[str, str] = field(default_factory=dict)

    @property
    def function(self) -> str:
        """The module-level name the forward calls: the label without its occurrence suffix."""
        return function_name(self.label)

    def parameter(self, name: str) -> str:
        """This kernel's parameter for the mixer's argument ``name``; ``ENTERING_STATE`` is the state the call starts from."""
        if name == ENTERING_STATE:
            return self.entering_state or ENTERING_STATE
        return self.renamed.get(name, name)

    def argument(self, envoy: "RecurrentMixer", name: str) -> BoundArgument:
        """The ``select`` of argument ``name``: found by the signature of the pure-torch function the call runs."""
        return BoundArgument(_signature(dispatch(bound_kernel(envoy, self.label)).torch_function), self.parameter(name))


@functools.cache
def _signature(function: Callable) -> inspect.Signature:
    return inspect.signature(function)


class Dispatch(NamedTuple):
    """What transformers' hub dispatcher binds under a kernel's name."""

    torch_function: Callable  #: the pure-torch kernel, with Python source
    implementation: Callable  #: what the dispatcher calls: the pure-torch kernel, or an optimized one
    package: str | None  #: the package the optimized kernel comes from ("fla", "mamba_ssm")


@functools.cache
def dispatch(function: Callable) -> Dispatch:
    """Read the hub dispatcher's closure around ``function``; a plain function dispatches to itself.

    transformers decorates each kernel with ``use_kernel_func_from_hub_with_fallback``,
    which binds the module-level name to a wrapper closing over
    ``torch_function`` (the pure-torch body) and ``implementation`` (what it
    calls: an installed package's kernel, else ``torch_function``).
    """
    try:
        nonlocals = inspect.getclosurevars(function).nonlocals
    except TypeError:
        return Dispatch(function, function, None)
    if "torch_function" not in nonlocals:
        return Dispatch(function, function, None)
    pure = nonlocals["torch_function"]
    return Dispatch(pure, nonlocals.get("implementation", pure), nonlocals.get("package"))


def function_name(label: str) -> str:
    """The module-level name an operation label calls: ``torch_chunk_gated_delta_rule_0`` -> ``torch_chunk_gated_delta_rule``."""
    return re.sub(r"_\d+$", "", label)


def modeling_module(module_class: type) -> ModuleType:
    """The modeling module a mixer class is defined in, where its forward looks its kernels up."""
    return sys.modules[module_class.__module__]


def bound_kernel(envoy: "RecurrentMixer", label: str) -> Callable | None:
    """The function the mixer's forward calls under ``label``.

    The live module-level binding, unless nnsight has instrumented this
    module's forward: it compiles it over a copy of the modeling module's
    globals, which keeps the bindings of that moment.
    """
    module = envoy._module
    name = function_name(label)
    state = module.__dict__.get(STATE)
    if state is not None and state.sourced:
        return compiled_globals(state.body).get(name)
    return getattr(modeling_module(type(module)), name, None)


def compiled_globals(body: Callable) -> dict:
    """The globals nnsight compiled an instrumented forward over: its innermost function's, under the decorators."""
    if body not in _COMPILED_GLOBALS:
        innermost, _ = decorator_chain(body)
        _COMPILED_GLOBALS[body] = innermost.__globals__
    return _COMPILED_GLOBALS[body]


def needs_kernel_call(envoy: "RecurrentMixer") -> str | None:
    """Why a value computed from the kernel call's arguments is unavailable, or ``None``.

    The arguments are read at the call in the mixer's own forward, whatever
    the kernel's name is bound to (routed, transformers' default, or an
    optimized package's kernel). So the reason is the forward's: it makes no
    such call.
    """
    module = envoy._module
    for call in type(envoy).calls():
        if bound_kernel(envoy, call.label) is None:
            return f"{type(module).__name__}'s forward calls no {call.function}"
    return None


def needs_torch_kernels(envoy: "RecurrentMixer") -> str | None:
    """Why a recurrent mixer's kernel values are unavailable, or ``None``: the kernel has no Python source to read inside."""
    reason = needs_kernel_call(envoy)
    if reason is not None:
        return reason
    for call in type(envoy).calls():
        dispatched = dispatch(bound_kernel(envoy, call.label))
        if dispatched.implementation is not dispatched.torch_function:
            return (
                f"read inside transformers' pure-torch {call.function}, but this process dispatches it to "
                f"an optimized kernel ({dispatched.package}) with no Python source; uninstall it, or call "
                f"nnterp.route_kernels(model.family, 'torch'), to read these"
            )
    return None


def kernel(attribute: str) -> Callable[["RecurrentMixer"], str]:
    """The key function of a value read at the kernel call: ``source.<label of envoy.kernel_call()>.<attribute>``."""

    def key(envoy: "RecurrentMixer") -> str:
        return f"source.{envoy.kernel_call().label}.{attribute}"

    return key


def argument(name: str) -> Callable[["RecurrentMixer"], BoundArgument]:
    """The ``select`` of the argument ``name`` of the kernel call that fires, found by that kernel's own signature."""

    def select(envoy: "RecurrentMixer") -> BoundArgument:
        return envoy.kernel_call().argument(envoy, name)

    return select


def forward_arguments(arguments: tuple[tuple, dict]) -> tuple[torch.Tensor, Any]:
    """The hidden states and the cache a mixer was called with."""
    args, kwargs = arguments
    hidden = args[0] if args else kwargs["hidden_states"]
    cache = next((kwargs[name] for name in CACHE_ARGUMENTS if name in kwargs), args[1] if len(args) > 1 else None)
    return hidden, cache
