"""The kernels a recurrent mixer calls: which function a kernel name is bound to, and whether its values can be read.

transformers' modeling modules call their recurrent kernels through module-level
names, bound by its hub dispatcher to a pure-torch function or an optimized
package's kernel. Values read inside a kernel need the pure-torch one
(:func:`needs_torch_kernels`); the state after every token needs the
token-by-token one bound under the prompt's name (:func:`needs_recurrent_routing`).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from nnsight.intervention.source import STATE, decorator_chain

if TYPE_CHECKING:
    from .recurrent import RecurrentMixer

#: Argument names a mixer's forward takes its cache under, across transformers versions.
CACHE_ARGUMENTS = ("cache_params", "cache", "past_key_values")

ROUTE_HINT = (
    "the state after each token is materialized only by the token-by-token kernel; the chunked kernel a "
    "prompt runs through carries it between chunks. Call nnterp.route_kernels(model.family, 'torch') before "
    "tracing this layer (slower, like attn_implementation='eager')"
)
TRACED_BEFORE_ROUTING = (
    "nnterp.route_kernels(model.family, 'torch') ran after this mixer was first traced: nnsight compiled its "
    "forward with the kernels bound then, and it keeps calling the chunked one. Route before the first trace "
    "that touches the mixer (load the model again to apply the routing to it)"
)

#: Mixer modules whose forward nnsight has instrumented: route_kernels warns that they keep their kernels.
INSTRUMENTED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()

#: An instrumented forward -> the globals it was compiled over (finding them parses its decorators' source).
_COMPILED_GLOBALS: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


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


def _token_loop(envoy: "RecurrentMixer") -> Callable:
    """The pure-torch kernel whose body binds ``STATE_OP`` once per token, where routing sends a prompt."""
    cls = type(envoy)
    loop_label = cls.CHUNK_KERNEL if cls.STEP_STATE_OP is not None else cls.RECURRENT_KERNEL
    return dispatch(bound_kernel(envoy, loop_label)).torch_function


def needs_kernel_call(envoy: "RecurrentMixer") -> str | None:
    """Why a value computed from the kernel call's arguments is unavailable, or ``None``: the forward makes no such call.

    The arguments are read at the call in the mixer's own forward, whatever
    the kernel's name is bound to (routed, transformers' default, or an
    optimized package's kernel), so this is the only reason.
    """
    for label in (type(envoy).CHUNK_KERNEL, type(envoy).RECURRENT_KERNEL):
        if bound_kernel(envoy, label) is None:
            return f"{type(envoy._module).__name__}'s forward calls no {function_name(label)}"
    return None


def needs_torch_kernels(envoy: "RecurrentMixer") -> str | None:
    """Why a recurrent mixer's kernel values are unavailable, or ``None``: the kernel has no Python source to read inside."""
    reason = needs_kernel_call(envoy)
    if reason is not None:
        return reason
    for label in (type(envoy).CHUNK_KERNEL, type(envoy).RECURRENT_KERNEL):
        dispatched = dispatch(bound_kernel(envoy, label))
        if dispatched.implementation is not dispatched.torch_function:
            return (
                f"read inside transformers' pure-torch {function_name(label)}, but this process dispatches it to "
                f"an optimized kernel ({dispatched.package}) with no Python source; uninstall it, or call "
                f"nnterp.route_kernels(model.family, 'torch'), to read these"
            )
    return None


def needs_recurrent_routing(envoy: "RecurrentMixer") -> str | None:
    """Why the state after each token is unavailable, or ``None``.

    In this order: the mixer's kernels never bind the state once per token;
    they have no Python source (:func:`needs_torch_kernels`); the prompt's
    kernel name is not bound to the token loop (:func:`route_kernels`), which
    also covers a mixer nnsight compiled before the routing.
    """
    cls = type(envoy)
    if cls.STATE_OP is None:
        return "this mixer's kernels do not materialize the state after each token"
    reason = needs_torch_kernels(envoy)
    if reason is not None:
        return reason
    loop = _token_loop(envoy)
    if bound_kernel(envoy, cls.CHUNK_KERNEL) is loop:
        return None
    live = getattr(modeling_module(type(envoy._module)), function_name(cls.CHUNK_KERNEL), None)
    return TRACED_BEFORE_ROUTING if live is loop else cls.ROUTE_HINT


def kernel(attribute: str) -> Callable[["RecurrentMixer"], str]:
    """The key function of a value read at the kernel call: ``source.<KERNEL(envoy)>.<attribute>``."""

    def key(envoy: "RecurrentMixer") -> str:
        return f"source.{type(envoy).KERNEL(envoy)}.{attribute}"

    return key


def argument_at(arguments: tuple[tuple, dict], place: int | str) -> Any:
    """The argument of a call's ``(args, kwargs)`` at ``place``: a position, or a keyword (``None`` when not passed)."""
    args, kwargs = arguments
    return kwargs.get(place) if isinstance(place, str) else args[place]


def forward_arguments(arguments: tuple[tuple, dict]) -> tuple[torch.Tensor, Any]:
    """The hidden states and the cache a mixer was called with."""
    args, kwargs = arguments
    hidden = args[0] if args else kwargs["hidden_states"]
    cache = next((kwargs[name] for name in CACHE_ARGUMENTS if name in kwargs), args[1] if len(args) > 1 else None)
    return hidden, cache
