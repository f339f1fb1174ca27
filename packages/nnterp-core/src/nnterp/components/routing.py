"""route_kernels: binding a family's recurrent kernel names to transformers' pure-torch functions, process-wide."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType

from ..family import declared, is_family
from ..forward_source import callee
from ..registry import REGISTRY
from .call_site import INSTRUMENTED, bound_kernel
from .declaration import STASH, DeclarationMismatch, forward_layout, modeling_module
from .recurrent import RecurrentMixer

#: The modes :func:`route_kernels` accepts.
ROUTE_MODES = ("torch", "default")


def _mixers(family: ModuleType) -> list[tuple[type, type]]:
    """``(module class, RecurrentMixer subclass)`` for every recurrent mixer a family wraps."""
    if not is_family(family):
        raise ValueError(
            f"route_kernels takes a family module (model.family, or nnterp.families.<name>) or the "
            f"transformers modeling module of one, not {family!r}"
        )
    return [
        (module_class, envoy_class)
        for module_class, envoy_class in declared(family).ENVOYS.items()
        if isinstance(module_class, type) and isinstance(envoy_class, type) and issubclass(envoy_class, RecurrentMixer)
    ]


def _family_of(target: ModuleType) -> ModuleType:
    """The family a route_kernels argument names: a family module, or the modeling module one declares."""
    if isinstance(target, ModuleType) and not is_family(target):
        for family in REGISTRY.families().values():
            if declared(family).MODELING is target:
                return family
    return target


def _routes(family: ModuleType, mode: str) -> dict[tuple[ModuleType, str], Callable]:
    """What each kernel name of a family's modeling modules is bound to under ``mode``."""
    routes: dict[tuple[ModuleType, str], Callable] = {}
    for module_class, mixer in _mixers(family):
        modeling = modeling_module(module_class)
        stash = getattr(modeling, STASH, {})
        for call in mixer.calls():
            if not hasattr(modeling, call.function):
                raise ValueError(f"{modeling.__name__} binds no {call.function}, the kernel {mixer.__name__} expects")
        # what the module bound at import, whatever is routed now
        imported = {call.function: stash.get(call.function, getattr(modeling, call.function)) for call in mixer.calls()}
        pure = {name: callee(function).torch_function for name, function in imported.items()}
        for call in mixer.calls():
            routes[(modeling, call.function)] = (
                imported[call.function] if mode == "default" else mixer.PER_TOKEN.routed_function(mixer, call, pure)
            )
    return routes


def route_kernels(family: ModuleType, mode: str) -> None:
    """Bind a family's recurrent kernels, process-wide.

    ``"torch"`` binds the prompt's and the decode step's kernel names in the
    family's modeling module to transformers' pure-torch kernels: the slower
    path, and the only one with Python source to read values inside. What
    each name gets is the mixer's ``PER_TOKEN`` strategy's to say: a token loop
    (a gated DeltaNet) binds the prompt's name to the decode kernel's loop, so
    a prompt runs token by token and ``state``, ``states``, ``state_after``
    and ``set_state_after`` reach every position; a scan loop (Mamba-1), whose
    prompt kernel is itself the loop, and chunk boundaries (Mamba-2) keep each
    name on its own function. ``"default"`` restores what the module bound at
    import.

    Like installing a kernel package it applies to every model of the family.
    Call it before the first trace that touches a mixer: nnsight compiles a
    mixer's forward over the bindings of that moment and the forward keeps
    them; routing afterwards, either way, warns, naming how many mixers keep
    the kernels they were compiled with (under ``"torch"`` their ``states``
    then say so too).

    Args:
        family: The family module (``model.family``,
            ``nnterp.families.qwen3_5_text``) or its transformers modeling module.
        mode: ``"torch"`` or ``"default"``.

    Raises:
        ValueError: an unknown mode, or something that is not a family with
            recurrent mixers. Nothing is rebound then.
    """
    if mode not in ROUTE_MODES:
        raise ValueError(f"route_kernels mode must be one of {', '.join(map(repr, ROUTE_MODES))}, not {mode!r}")
    family = _family_of(family)
    mixers = _mixers(family)
    if not mixers:
        routable = sorted(name for name, candidate in REGISTRY.families().items() if _mixers(candidate))
        raise ValueError(
            f"family {family.__name__} wraps no recurrent mixer, so it has no kernels to route; the installed "
            f"families with one: {', '.join(routable) or '(none)'}"
        )
    routes = _routes(family, mode)
    for (modeling, name), function in routes.items():
        stash = modeling.__dict__.setdefault(STASH, {})
        stash.setdefault(name, getattr(modeling, name))
        setattr(modeling, name, function)
    if mode == "default":
        for modeling in {modeling for modeling, _ in routes}:
            delattr(modeling, STASH)
    _warn_if_compiled(mixers, routes, mode)


def _warn_if_compiled(
    mixers: list[tuple[type, type]], routes: dict[tuple[ModuleType, str], Callable], mode: str
) -> None:
    stale = 0
    for module in list(INSTRUMENTED):
        mixer = next((mixer for module_class, mixer in mixers if isinstance(module, module_class)), None)
        if mixer is None:
            continue
        try:
            layout = forward_layout(mixer, type(module))
        except DeclarationMismatch:
            continue
        modeling = modeling_module(type(module))
        compiled = {located.call.function: bound_kernel(module, located) for located in layout.calls()}
        if any(
            callee(compiled.get(name)).function is not callee(function).function
            for (where, name), function in routes.items()
            if where is modeling and name in compiled
        ):
            stale += 1
    if stale:
        kept = "the chunked kernels" if mode == "torch" else "the token-by-token kernels (and their per-token states)"
        warnings.warn(
            f"route_kernels(..., {mode!r}): {stale} mixer module(s) of this family were already traced and keep "
            f"{kept} they were compiled with; the routing applies to models loaded (or first traced) from now on",
            stacklevel=3,
        )
