"""What a recurrent mixer kind declares about the kernel calls its forward makes, and finding them in the installed one.

A mixer kind names its two kernels by the functions the modeling module calls
(``torch_chunk_gated_delta_rule`` on a prompt, ``torch_recurrent_gated_delta_rule``
on a decode step), the parameter that takes the state a call starts from, and
the variable the kernel's body binds the state after each token to
(:class:`KernelCall`). Nothing in it is an operation label: :func:`forward_layout`
reads the installed forward (:mod:`nnterp.forward_source`) and finds where it
makes each call, including a call inside a helper function the forward calls
(transformers 5.25's ``mamba_scan_forward``) and the decode kernel's calls in
a loop after the prompt's kernel for the states a cache keeps (5.25's
``get_recurrent_states_to_keep``).

When the installed forward does not make the calls a declaration describes,
:class:`DeclarationMismatch` says what was expected and what was found, and
every value that depends on it is unavailable with that sentence
(:func:`declaration_mismatch`), before any model runs.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FunctionType, ModuleType
from typing import TYPE_CHECKING, Any

import transformers

from ..family import declared
from ..forward_source import Arm, Binding, Call, ForwardSource, NotInForward, Operation, callee

if TYPE_CHECKING:
    from .recurrent import RecurrentMixer

#: Where ``route_kernels`` keeps a modeling module's import-time kernels while it is routed.
STASH = "_nnterp_kernels"

#: The name under which a mixer asks a kernel call for the state the call starts from (``KernelCall.entering_state``).
ENTERING_STATE = "state"


@dataclass(frozen=True)
class KernelCall:
    """One kernel a recurrent mixer's forward calls: a prompt's, or a decode step's, declared by what it is.

    Its arguments are found by the pure-torch kernel's own signature
    (:meth:`parameter`), so a parameter that moves, or is passed by keyword
    instead of position, in a new transformers release needs no edit.
    """

    #: The module-level name the forward (or a helper it calls) calls: ``torch_chunk_gated_delta_rule``.
    function: str
    #: The kernel's parameter taking the state the call starts from; ``None`` for a kernel that starts from zeros.
    entering_state: str | None = None
    #: Inside the kernel's body, the binding of the state after each token (or of every chunk boundary's state, where
    #: the mixer gets its per-token states from chunk boundaries); ``None``: the body binds none.
    token_state: Binding | None = None
    #: The mixer's name for an argument -> this kernel's parameter, where the mixer's two kernels differ.
    renamed: Mapping[str, str] = field(default_factory=dict)
    #: Other places inside the kernel's body the mixer reads, by the mixer's name for each:
    #: ``{"head_outputs": Binding("scan_output", under="D is not None")}``.
    reads: Mapping[str, Binding | Call] = field(default_factory=dict)

    def parameter(self, name: str) -> str:
        """This kernel's parameter for the mixer's argument ``name``; ``ENTERING_STATE`` is the state the call starts from."""
        if name == ENTERING_STATE:
            return self.entering_state or ENTERING_STATE
        return self.renamed.get(name, name)


@dataclass(frozen=True)
class Located:
    """A declared kernel call, found in the installed forward: the labels that lead to it, and the names on the way."""

    call: KernelCall
    #: The operation labels from the mixer's forward down to the call: ``("torch_chunk_gated_delta_rule_0",)``, or
    #: through a helper, ``("mamba_scan_forward_0", "mamba_selective_scan_0")``.
    path: tuple[str, ...]
    #: The module-level names of the helpers the path passes through, then the kernel's: what the forward calls.
    names: tuple[str, ...]
    #: The loop the call sits in inside its function, for a call the forward makes several times; else ``None``.
    loop: str | None = None
    #: The conditions the call sits under inside its function.
    arms: tuple[Arm, ...] = ()

    @property
    def key(self) -> str:
        """The call's place relative to the mixer: ``source.<label>`` with ``.source.`` between nested labels."""
        return "source." + ".source.".join(self.path)


@dataclass(frozen=True)
class ForwardLayout:
    """Where a mixer module's installed forward makes its declared kernel calls."""

    prompt: Located
    decode: Located
    #: The decode kernel called once per kept token after the prompt's kernel (transformers 5.25's states a cache
    #: keeps for speculative decoding), or ``None`` where the forward keeps none.
    kept: Located | None = None

    def calls(self) -> tuple[Located, ...]:
        return tuple(located for located in (self.prompt, self.decode, self.kept) if located is not None)


class DeclarationMismatch(LookupError):
    """A mixer's declaration does not match the installed transformers' forward: what was expected and what was found."""


def modeling_module(module_class: type) -> ModuleType:
    """The modeling module a mixer class is defined in, where its forward looks its kernels up."""
    return sys.modules[module_class.__module__]


def _forward(module_class: type) -> ForwardSource:
    return ForwardSource.of(module_class.forward)


def _helpers(scope: ForwardSource, modeling: ModuleType, kernels: set[str]) -> list[tuple[Operation, Any]]:
    """The calls in ``scope`` of functions of the modeling module that are not kernels: where a call may be nested."""
    found = []
    for operation in scope.operations:
        name = operation.called
        if name is None or "." in name or name in kernels:
            continue
        bound = scope.resolve(name)
        function = callee(bound).function if callable(bound) else None
        if isinstance(function, FunctionType) and function.__module__ == modeling.__name__:
            found.append((operation, function))
    return found


def _calls(
    module_class: type, call: KernelCall, kernels: set[str]
) -> list[tuple[tuple[Operation, ...], tuple[str, ...]]]:
    """Every call of ``call.function`` in the forward or in a helper it calls: (the operations leading to it, names)."""
    forward = _forward(module_class)
    found = [((operation,), (call.function,)) for operation in forward.calls(call.function)]
    for helper, function in _helpers(forward, modeling_module(module_class), kernels):
        inner = ForwardSource.of(function)
        found += [((helper, operation), (helper.called, call.function)) for operation in inner.calls(call.function)]
    return found


def _described(path: tuple[Operation, ...]) -> str:
    operation = path[-1]
    where = f" in {path[0].called}" if len(path) > 1 else ""
    arms = f" under {', '.join(map(str, operation.arms))}" if operation.arms else ""
    loops = f" in `{operation.loops[-1].header}`" if operation.loops else ""
    return f"line {operation.line}{where}{arms}{loops}"


def _located(call: KernelCall, path: tuple[Operation, ...], names: tuple[str, ...], loop: bool) -> Located:
    if loop and not path[-1].loops:
        raise NotInForward(f"the call of {call.function} inside a loop, once per head; found: {_described(path)}")
    labels = tuple(operation.label for operation in path)
    return Located(call, labels, names, path[-1].loops[-1].header if loop else None, path[-1].arms)


@functools.cache
def forward_layout(mixer: type["RecurrentMixer"], module_class: type) -> ForwardLayout:
    """Find ``mixer``'s declared kernel calls in ``module_class``'s installed forward.

    The prompt's kernel is called once (``CALLS_PER_FORWARD`` times, in a loop,
    where the mixer declares so); the decode kernel once more outside any loop
    the prompt's call is not in, and, from transformers 5.25, in a loop of its
    own after the prompt's kernel for the states a cache keeps. Each kernel's parameters and
    the bindings the declaration names inside its body are checked too.

    Raises:
        DeclarationMismatch: the forward makes other calls than the declaration says, saying what was expected,
            what was found, the family and the transformers version.
    """
    try:
        return _find_layout(mixer, module_class)
    except (NotInForward, DeclarationMismatch) as error:
        raise DeclarationMismatch(mismatch_message(mixer, module_class, str(error))) from None


def _find_layout(mixer: type["RecurrentMixer"], module_class: type) -> ForwardLayout:
    prompt_call, decode_call = mixer.calls()
    kernels = {prompt_call.function, decode_call.function}
    looped = mixer.CALLS_PER_FORWARD is not None
    prompts = _calls(module_class, prompt_call, kernels)
    if not prompts:
        raise NotInForward(f"a call of {prompt_call.function}, the prompt's kernel; the forward makes none")
    if len(prompts) != 1:
        raise NotInForward(
            f"one call of {prompt_call.function}, the prompt's kernel; found {len(prompts)}: "
            + "; ".join(_described(path) for path, _ in prompts)
        )
    prompt_path, prompt_names = prompts[0]
    prompt = _located(prompt_call, prompt_path, prompt_names, looped)
    decodes, kept = [], []
    for path, names in _calls(module_class, decode_call, kernels):
        # the kept states' calls run in a loop of their own, which the prompt's call is not in
        (kept if len(path[-1].loops) > len(prompt_path[-1].loops) else decodes).append((path, names))
    if len(decodes) != 1:
        found = "; ".join(_described(path) for path, _ in decodes) or "none"
        raise NotInForward(f"one call of {decode_call.function}, the decode step's kernel; found: {found}")
    if len(kept) > 1:
        found = "; ".join(_described(path) for path, _ in kept)
        raise NotInForward(f"at most one call of {decode_call.function} for the kept states; found: {found}")
    layout = ForwardLayout(
        prompt,
        _located(decode_call, *decodes[0], looped),
        _located(decode_call, *kept[0], False) if kept else None,
    )
    for located in layout.calls():
        _check_kernel(mixer, module_class, located)
    mixer.check_forward(module_class, layout)
    return layout


def kernel_function(module_class: type, located: Located) -> Any:
    """What the name a call calls is bound to in the modeling module now (routed, or as imported).

    A kernel the forward calls as a method, ``self.<name>`` (RG-LRU's ``self._rnn_scan``), is the function the
    module's class binds to that name.
    """
    if located.names[-1].startswith("self."):
        return getattr(module_class, located.names[-1].removeprefix("self."), None)
    namespace = vars(modeling_module(module_class))
    for name in located.names[:-1]:
        namespace = callee(namespace[name]).function.__globals__
    return namespace.get(located.names[-1])


def imported_kernel(module_class: type, located: Located) -> Any:
    """What the name a call calls was bound to at import, whatever ``route_kernels`` bound it to since."""
    live = kernel_function(module_class, located)
    namespace = vars(modeling_module(module_class))
    for name in located.names[:-1]:
        namespace = callee(namespace[name]).function.__globals__
    return namespace.get(STASH, {}).get(located.names[-1], live)


def _check_kernel(mixer: type["RecurrentMixer"], module_class: type, located: Located) -> None:
    """The kernel takes the parameters the declaration reads, and its body binds what it names."""
    torch_function = callee(imported_kernel(module_class, located)).torch_function
    call = located.call
    parameters = inspect.signature(torch_function).parameters
    wanted = [call.parameter(ENTERING_STATE)] if call.entering_state is not None else []
    wanted += [call.parameter(name) for name in mixer.arguments()]
    missing = [name for name in wanted if name not in parameters]
    if missing:
        raise NotInForward(
            f"{call.function} taking {', '.join(map(repr, missing))}; its parameters: {', '.join(parameters)}"
        )
    body = ForwardSource.of(torch_function)
    for place in call.reads.values():
        place.find(body)
    if call.token_state is not None and mixer.PER_TOKEN.body_of(mixer, call) is call:
        call.token_state.find(body)


def mismatch_message(mixer: type["RecurrentMixer"], module_class: type, detail: str, reads: str | None = None) -> str:
    """The sentence a declaration that does not match the installed forward gives: family, version, expected, found.

    ``reads`` says what the mixer reads its values at, for a kind read at places of its own forward rather than at
    kernel calls: ``"reads the mLSTM at the layer's calls of its backend, norm and output gate"``.
    """
    family = family_of(module_class)
    named = f"the {family} family" if family else f"{mixer.__name__}"
    reads = reads or f"declares {mixer.__name__}'s kernel calls"
    return (
        f"{module_class.__name__}'s forward changed in transformers {transformers.__version__}: {named} {reads}, and "
        f"expected {detail}. {named[0].upper()}{named[1:]} needs an update for transformers {transformers.__version__}"
    )


def family_of(module_class: type) -> str | None:
    """The name of the installed family whose envoys wrap ``module_class``, if any."""
    from ..registry import REGISTRY

    for name, family in REGISTRY.families().items():
        if module_class in declared(family).ENVOYS:
            return name
    return None


def declaration_mismatch(envoy: "RecurrentMixer") -> str | None:
    """Why ``envoy``'s declaration does not describe its module's installed forward, or ``None`` when it does."""
    return type(envoy).forward_mismatch(type(envoy._module))


def forward_changes(family: ModuleType) -> list[str]:
    """Why each recurrent mixer a family wraps does not match the installed forward: empty when every one does.

    What ``nnterp check`` reports as "forward changed" for the family, in
    place of running its suites against values that are all unavailable.
    """
    from .recurrent import RecurrentMixer

    changes = []
    for module_class, envoy in declared(family).ENVOYS.items():
        if isinstance(module_class, type) and isinstance(envoy, type) and issubclass(envoy, RecurrentMixer):
            change = envoy.forward_mismatch(module_class)
            changes += [change] if change is not None else []
    return changes
