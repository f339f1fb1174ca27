"""The call site: what one forward of a recurrent mixer calls, and what that call recorded.

A mixer's declaration (:mod:`.declaration`) says which kernels its forward
calls; :class:`CallSite` follows one call of the mixer: which kernel fires
(decided once per call by the forward's own test, the cache holding a state
for one token), the kernel call's arguments as the forward passed them (read
once, at the call's start, with a copy of the state it starts from), the
state after each token inside the kernel's body, and the write-back of a
state a user edited.

transformers 5.25 calls kernels through ``kernels``' hub function modules,
which nnsight cannot drill into. Once nnsight has instrumented a mixer's
forward, :meth:`CallSite.source` binds, in that forward's own copy of the
modeling module's globals (never the module itself), each hub function
module on the way to a declared kernel to the function it runs: the
computation is the same, and the kernel's body can be drilled into. A hub
function module that ``kernels.kernelize`` replaced with a hub kernel is left
alone, and the values read inside it say so.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import FunctionType
from typing import TYPE_CHECKING, Any

import torch
from nnsight.intervention.interleaver import Mediator
from nnsight.intervention.source import STATE

from ..forward_source import Call, ForwardSource, callee, hub_kernel_replacing, hub_module_function, innermost
from ..order import OrderError, standard_path
from ..value_paths import BoundArgument, resolve
from .declaration import (
    ENTERING_STATE,
    DeclarationMismatch,
    ForwardLayout,
    KernelCall,
    Located,
    declaration_mismatch,
    forward_layout,
    modeling_module,
)
from .per_call import per_call, pinned, replace_per_call

if TYPE_CHECKING:
    from .recurrent import RecurrentMixer

#: Argument names a mixer's forward takes its cache under, across transformers versions.
CACHE_ARGUMENTS = ("cache_params", "cache", "past_key_values")

#: Mixer modules whose forward nnsight has instrumented: route_kernels warns that they keep their kernels.
INSTRUMENTED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()

#: The attribute of a served state copy holding (the buffer it goes back into or ``None``, its layout), for the
#: write-back of an in-place edit.
SERVED_FROM = "_nnterp_served_from"

#: The module attribute recording the instrumented forward whose globals hold the exposed kernels.
EXPOSED = "_nnterp_exposed"

#: The attribute of a helper's copy naming the function it was copied from.
COPIED_FROM = "_nnterp_copied_from"

#: Inside transformers' hub dispatcher, the call that runs the kernel's implementation.
DISPATCHED = Call("implementation")


def forward_arguments(arguments: tuple[tuple, dict]) -> tuple[torch.Tensor, Any]:
    """The hidden states and the cache a mixer was called with."""
    args, kwargs = arguments
    hidden = args[0] if args else kwargs["hidden_states"]
    cache = next((kwargs[name] for name in CACHE_ARGUMENTS if name in kwargs), args[1] if len(args) > 1 else None)
    return hidden, cache


def has_cached_state(cache: Any, layer_idx: int) -> bool:
    """Whether ``cache`` holds a recurrent state for layer ``layer_idx``: the test every recurrent forward makes.

    ``get_recurrent_state`` (transformers 5.25 on) returns ``None`` for a layer
    with no state yet; before, ``has_previous_state`` answers, for the layer's
    first state where it holds several (Qwen4-exp's layers also keep an n-gram
    state, which a linear-attention layer never sets, so asking for all of them
    would never say yes).
    """
    get = getattr(cache, "get_recurrent_state", None)
    if get is not None:
        try:
            return get(layer_idx) is not None
        except (ValueError, IndexError):
            return False
    previous = cache.has_previous_state
    if "state_idx" in inspect.signature(previous).parameters:
        return bool(previous(layer_idx, state_idx=0))
    return bool(previous(layer_idx))


def kept_states(cache: Any, layer_idx: int, seq: int) -> int:
    """How many of a prompt's last tokens the forward runs through the decode kernel, to keep their states.

    transformers 5.25 keeps them for speculative decoding
    (``activate_past_recording``); 0 before, and whenever no cache records.
    """
    get = getattr(cache, "get_recurrent_states_to_keep", None)
    return 0 if cache is None or get is None else min(get(layer_idx) or 0, seq)


# -- what a call runs ---------------------------------------------------------------------------------


def bound_kernel(module: torch.nn.Module, located: Located) -> Any:
    """What the call ``located`` runs on ``module``: through its forward's exposed globals once instrumented, else the
    modeling module's live names (each helper on the way unwrapped)."""
    state = module.__dict__.get(STATE)
    if state is not None and state.sourced:
        namespace = compiled_globals(state.body)
    else:
        namespace = vars(modeling_module(type(module)))
    for name in located.names[:-1]:
        helper = namespace.get(name)
        function = hub_module_function(helper) or helper
        namespace = getattr(function, "__globals__", {})
    return namespace.get(located.names[-1])


def live_bindings(module_class: type, located: Located) -> list[tuple[str, Any]]:
    """Each name on the way to the call ``located`` and what the modeling module binds it to now."""
    namespace, bound = vars(modeling_module(module_class)), []
    for name in located.names:
        value = namespace.get(name)
        bound.append((name, value))
        namespace = getattr(callee(value).function, "__globals__", {}) if value is not None else {}
    return bound


def compiled_globals(body: Callable) -> dict:
    """The globals nnsight compiled an instrumented forward over: its innermost function's, under the decorators."""
    return innermost(body).__globals__


def expose(module: torch.nn.Module, layout: ForwardLayout) -> None:
    """Bind each hub function module on the way to ``layout``'s kernel calls to the function it runs, in the globals
    of ``module``'s instrumented forward (and of a copy of each helper on the way).

    Once per instrumented forward. A function module ``kernels.kernelize``
    replaced with a hub kernel for this module keeps running it.
    """
    state = module.__dict__.get(STATE)
    if state is None or not state.sourced or module.__dict__.get(EXPOSED) is state.body:
        return
    namespace = compiled_globals(state.body)
    for located in layout.calls():
        _expose(module, namespace, located.names)
    module.__dict__[EXPOSED] = state.body


def _expose(module: torch.nn.Module, namespace: dict, names: tuple[str, ...]) -> None:
    name, rest = names[0], names[1:]
    bound = namespace.get(name)
    if bound is None or hub_kernel_replacing(module, bound) is not None:
        return
    function = hub_module_function(bound)
    if function is not None:
        bound = function
    if rest:
        if getattr(bound, COPIED_FROM, None) is None:
            bound = _copy(bound)
        _expose(module, bound.__globals__, rest)
    namespace[name] = bound


def _copy(function: FunctionType) -> FunctionType:
    """``function`` over its own copy of its globals, where its kernels can be exposed for one module."""
    copied = FunctionType(
        function.__code__, dict(function.__globals__), function.__name__, function.__defaults__, function.__closure__
    )
    copied.__kwdefaults__ = function.__kwdefaults__
    copied.__qualname__ = function.__qualname__
    setattr(copied, COPIED_FROM, function)
    return copied


# -- whether values can be read -----------------------------------------------------------------------


def needs_kernel_call(envoy: "RecurrentMixer") -> str | None:
    """Why a value computed from the kernel call's arguments is unavailable, or ``None``.

    The arguments are read at the call in the mixer's own forward, whatever
    the kernel's name is bound to (routed, transformers' default, an optimized
    package's kernel or a hub kernel). So the reasons are the forward's: it
    does not make the calls the mixer's declaration says, or a helper that
    makes them was replaced by a hub kernel, which makes none.
    """
    reason = declaration_mismatch(envoy)
    if reason is not None or not type(envoy).calls():
        return reason
    for located in envoy.forward_layout().calls():
        for helper, bound in live_bindings(type(envoy._module), located)[:-1]:
            replaced = hub_kernel_replacing(envoy._module, bound)
            if replaced is not None:
                return _kernelized(envoy, helper, replaced, "which calls none of the kernels the values are read at")
    return None


def _kernelized(envoy: "RecurrentMixer", name: str, replaced: str, what: str) -> str:
    return (
        f"{type(envoy._module).__name__} runs {name} as the hub kernel {replaced}, which kernels.kernelize put in "
        f"place of transformers' Python function ({what}); load the model without use_kernels=True (and do not "
        f"kernelize it) to read these"
    )


def needs_torch_kernels(envoy: "RecurrentMixer") -> str | None:
    """Why a recurrent mixer's kernel values are unavailable, or ``None``: the kernel has no Python source to read inside.

    A hub kernel ``kernels.kernelize`` put in place of one of the forward's
    function modules, or an optimized package's kernel behind transformers'
    dispatcher (flash-linear-attention, mamba_ssm).
    """
    reason = needs_kernel_call(envoy)
    if reason is not None:
        return reason
    module = envoy._module
    for located in envoy.forward_layout().calls():
        replaced = hub_kernel_replacing(module, live_bindings(type(module), located)[-1][1])
        if replaced is not None:
            return _kernelized(envoy, located.call.function, replaced, "with no Python source to read inside")
        dispatched = callee(bound_kernel(module, located))
        if dispatched.implementation is not dispatched.torch_function:
            return (
                f"read inside transformers' pure-torch {located.call.function}, but this process dispatches it to "
                f"an optimized kernel ({dispatched.package}) with no Python source; uninstall it, or call "
                f"nnterp.route_kernels(model.family, 'torch'), to read these"
            )
    return None


# -- keys and selections -------------------------------------------------------------------------------


def kernel(attribute: str) -> Callable[["RecurrentMixer"], str]:
    """The key function of a value read at the kernel call that fires: ``<its place>.<attribute>``."""

    def key(envoy: "RecurrentMixer") -> str:
        return f"{envoy.located().key}.{attribute}"

    return key


@dataclass(frozen=True)
class ArgumentOf:
    """The ``select`` of an argument of the kernel call that fires, found by that kernel's own signature."""

    name: str

    def __call__(self, envoy: "RecurrentMixer") -> BoundArgument:
        return envoy.kernel_call_argument(self.name)


def argument(name: str) -> ArgumentOf:
    """The ``select`` of the argument ``name`` (the mixer's name for it) of the kernel call that fires."""
    return ArgumentOf(name)


@dataclass(frozen=True)
class Segment:
    """One of the kernel calls a call of the mixer makes: which declared call, and the mixer call's tokens it covers."""

    located: Located
    start: int
    stop: int
    #: Its place among the call's segments, in the order the forward makes them.
    position: int


class CallSite:
    """One call of a recurrent mixer: which declared kernel fires, its arguments, its states and their write-back.

    Mixed into ``RecurrentMixer``, whose subclass declares ``PROMPT`` and
    ``DECODE`` (:class:`~.declaration.KernelCall`). Everything here is
    recorded once per call of the mixer (:func:`~.per_call.per_call`), so
    the same values work in a trace and on every step of ``tracer.iter``.
    """

    PROMPT: KernelCall
    DECODE: KernelCall
    #: The mixer module's attribute counting the kernel calls one forward makes, where the forward calls its kernel
    #: in a loop (``"n_mamba_heads"``); ``None``: once per forward.
    CALLS_PER_FORWARD: str | None = None
    #: The mixer's arguments that carry one entry per token, and their tokens axis in the prompt kernel's layout: how
    #: the arguments of a call that makes several kernel calls are joined (``merged_arguments``).
    TOKEN_AXES: Mapping[str, int] = {}

    @property
    def source(self) -> Any:
        """nnsight's ``.source``, with the hub function modules on the way to the mixer's kernels exposed (``expose``).

        Records that this mixer's forward is compiled (``route_kernels`` warns about it).
        """
        source = super().source
        INSTRUMENTED.add(self._module)
        try:
            layout = self.forward_layout()
        except DeclarationMismatch:
            return source
        expose(self._module, layout)
        return source

    @classmethod
    def arguments(cls) -> tuple[str, ...]:
        """The kernel arguments the mixer's values are read at (each value's ``select=argument(name)``), by its names."""
        names: list[str] = []
        for klass in reversed(cls.__mro__):
            for value in vars(klass).values():
                select = getattr(value, "select", None)
                if isinstance(select, ArgumentOf) and select.name != ENTERING_STATE and select.name not in names:
                    names.append(select.name)
        return tuple(names)

    @classmethod
    def check_forward(cls, module_class: type, layout: ForwardLayout) -> None:
        """Check, once per installed forward, any place of it the kind reads beyond its kernel calls.

        A kind whose values are read at other operations of the forward (Zamba's, where every head's tensors are
        stacked before its loop) raises :class:`~nnterp.forward_source.NotInForward` here when the forward no
        longer holds them; the declaration is then a mismatch, reported like one of its kernel calls. By default
        there is nothing more to check.
        """

    @classmethod
    def forward_mismatch(cls, module_class: type) -> str | None:
        """Why ``module_class``'s installed forward does not make the calls this kind reads its values at, or ``None``.

        The sentence ``nnterp check`` reports as "forward changed", and every
        value that depends on the calls gives as its reason: by default, the
        declared kernel calls are not where :func:`~.declaration.forward_layout`
        looks. A kind read at places of its own forward, calling no kernel
        function (MiniMax's lightning attention, xLSTM's backend module),
        says what it looks for instead (:func:`~.declaration.mismatch_message`).
        """
        try:
            forward_layout(cls, module_class)
        except DeclarationMismatch as error:
            return str(error)
        return None

    @classmethod
    def calls(cls) -> tuple[KernelCall, KernelCall]:
        """The mixer's two kernel calls: the prompt's and the decode step's."""
        return cls.PROMPT, cls.DECODE

    def forward_layout(self) -> ForwardLayout:
        """Where this mixer's module's forward makes its declared kernel calls (``declaration.forward_layout``)."""
        return forward_layout(type(self), type(self._module))

    def calls_per_forward(self) -> int:
        """How many kernel calls one forward of this mixer makes, one after the other (``CALLS_PER_FORWARD``)."""
        attribute = type(self).CALLS_PER_FORWARD
        return 1 if attribute is None else getattr(self._module, attribute)

    def forward_call(self) -> tuple[int, Any]:
        """This call's length and the cache it was given, read once per call at the mixer's input."""

        def read() -> tuple[int, Any]:
            hidden, cache = forward_arguments(self.inputs)
            return hidden.shape[1], cache

        return per_call(self, "forward call", read)

    def kernel_call(self) -> KernelCall:
        """The kernel call that fires on this call of the mixer (``PROMPT`` or ``DECODE``), decided once per call.

        The forward's own test: the token-by-token update for one token over a
        cached state, the prompt's kernel for everything else (several tokens
        over a cached state included). While one segment of a call that makes
        several kernel calls is read (``segments``), that segment's.
        """
        segment = self.current_segment()
        if segment is not None:
            return segment.located.call
        cls = type(self)

        def choose() -> KernelCall:
            seq, cache = self.forward_call()
            decoding = seq == 1 and cache is not None and has_cached_state(cache, self._module.layer_idx)
            return cls.DECODE if decoding else cls.PROMPT

        return per_call(self, "kernel", choose)

    def located(self) -> Located:
        """Where the kernel call that fires on this call of the mixer (or on the segment being read) is made."""
        segment = self.current_segment()
        if segment is not None:
            return segment.located
        layout = self.forward_layout()
        return layout.decode if self.decoding() else layout.prompt

    def decoding(self) -> bool:
        """Whether the kernel that fires is the decode step's (the update over the cached state) rather than a prompt's."""
        return self.kernel_call() is type(self).DECODE

    # -- a call that makes several kernel calls ------------------------------------------------------

    def segments(self) -> tuple[Segment, ...]:
        """The kernel calls this call of the mixer makes, in order, each with the tokens it covers; decided once per call.

        One, but for a prompt over a cache that keeps the states of its last
        tokens (transformers 5.25's ``get_recurrent_states_to_keep``, for
        speculative decoding): the prompt's kernel over the tokens before them
        (skipped when there are none and the forward says so), then the decode
        kernel once per kept token.
        """

        def split() -> tuple[Segment, ...]:
            layout = self.forward_layout()
            seq, cache = self.forward_call()
            kept = 0
            if layout.kept is not None and not self.decoding():
                kept = kept_states(cache, self._module.layer_idx, seq)
            if not kept:
                return (Segment(self.located(), 0, seq, 0),)
            start = seq - kept
            pieces = []
            if start or not set(layout.prompt.arms) - set(layout.kept.arms):
                pieces.append(Segment(layout.prompt, 0, start, 0))
            pieces += [
                Segment(layout.kept, token, token + 1, len(pieces) + i) for i, token in enumerate(range(start, seq))
            ]
            return tuple(pieces)

        return per_call(self, "segments", split)

    def segmented(self) -> bool:
        """Whether this call of the mixer makes several kernel calls (``segments``)."""
        return len(self.segments()) > 1

    def current_segment(self) -> Segment | None:
        """The segment being read now (``in_segment``), if any."""
        return self._peek("segment")

    @contextmanager
    def in_segment(self, segment: Segment) -> Iterator[None]:
        """Read ``segment``'s values: its kernel call, its arguments, its places."""
        previous = self.current_segment()
        replace_per_call(self, "segment", segment)
        try:
            yield
        finally:
            replace_per_call(self, "segment", previous)

    def records(self) -> dict[tuple[int, str], Any]:
        """What every segment's kernel call was given and returned, and the places its body binds that the mixer
        reads (``KernelCall.reads``, and a one-token update's ``token_state``), by (segment, location): read once per
        call, in the forward's order.

        Each read is the next occurrence of its place, since the segments run
        one after the other: the sweep starts before the call's first kernel
        call and follows the forward to the last one's output.
        """

        def sweep() -> dict[tuple[int, str], Any]:
            recorded: dict[tuple[int, str], Any] = {}
            with pinned(None):
                for segment in self.segments():
                    with self.in_segment(segment):
                        operation = self._call_operation()
                        recorded[(segment.position, type(operation).inputs._location(operation))] = operation.inputs
                        body = self.body_source()
                        call = segment.located.call
                        # a one-token update binds its token state once: what its state_output is read at
                        one_token = [call.token_state] if call is type(self).DECODE and call.token_state else []
                        places = sorted(
                            {place.find(body).label: place for place in (*call.reads.values(), *one_token)}.values(),
                            key=lambda place: body.operations.index(place.find(body)),
                        )
                        for place in places:
                            node, attribute = resolve(self, f"{self._body_path()}.{place.find(body).label}.output")
                            location = getattr(type(node), attribute)._location(node)
                            recorded[(segment.position, location)] = getattr(node, attribute)
                        recorded[(segment.position, type(operation).output._location(operation))] = operation.output
            return recorded

        return per_call(self, "records", sweep)

    def recorded(self, location: str) -> Any:
        """What the segment being read recorded at ``location``.

        Raises:
            nnterp.OrderError: no segment records that place.
        """
        segment = self.current_segment()
        records = self.records()
        if (segment.position, location) not in records:
            raise OrderError(
                f"{standard_path(self)}: this call makes {len(self.segments())} kernel calls (it keeps the states of "
                f"its last tokens), and {location.rsplit('.', 2)[-2]} is not among what each of them records; read "
                f"the call's values at its kernel calls' arguments and outputs"
            )
        return records[(segment.position, location)]

    def spans_calls(self, value: Any) -> bool:
        """Whether ``value`` (a descriptor of this mixer) is read across several kernel calls of this call."""
        # the token place is one occurrence per token, asked for under tracer.iter's pin to a token: never a span
        if not value.is_operation() or value.name == "state" or declaration_mismatch(self) is not None:
            return False
        if self.forward_layout().kept is None:
            return False
        # a place outside this forward's kernel calls (a contribution the block scales) is one place on every call;
        # asked first, so deciding the segments (which reads the mixer's input) is left to values that need it
        if not value._location(self).startswith(f"{self.path}.source."):
            return False
        return self.segmented()

    def read_across_calls(self, value: Any) -> Any:
        """``value`` over the whole call: each segment's piece from its records, joined along the tokens axis.

        A value without a tokens axis is the first segment's when read at the
        kernel's arguments (the state the call starts from), the last
        segment's otherwise (the state it ends with). What is served is a
        copy: an edit of it does not reach the model (see ``write_across_calls``).
        """
        segments = self.segments()
        dims = value.dims or ()
        if "seq" not in dims:
            with self.in_segment(segments[0]):
                at_arguments = value._location(self).endswith((".input", ".inputs"))
            segments = segments[:1] if at_arguments else segments[-1:]
        pieces = []
        for segment in segments:
            with self.in_segment(segment):
                pieces.append(value._serve(self, self.recorded(value._location(self))))
        return torch.cat(pieces, dim=dims.index("seq")) if "seq" in dims else pieces[0]

    def write_across_calls(self, value: Any) -> None:
        """Refuse a write of ``value`` on a call that makes several kernel calls: its pieces' places follow each other."""
        raise OrderError(
            f"{value.name} on {standard_path(self)} is read-only on this call: it keeps the states of its last "
            f"{len(self.segments()) - 1} token(s) (a cache recording its past, as speculative decoding asks), so "
            f"transformers runs those tokens through the decode kernel one at a time after the prompt's kernel, and "
            f"the value spans kernel calls the forward makes one after the other. Write it in a trace whose cache "
            f"does not record its past (no activate_past_recording)"
        )

    def merged_arguments(self) -> tuple[tuple, dict]:
        """The call's arguments as one prompt kernel call over all its tokens: what the kind's math reads.

        Each argument that carries tokens (``TOKEN_AXES``) is the segments'
        pieces, laid out as the prompt's kernel takes them
        (``as_prompt_argument``) and joined; the others are the prompt
        segment's, else the first segment's.
        """
        cls = type(self)
        layout = self.forward_layout()
        signature = inspect.signature(callee(bound_kernel(self._module, layout.prompt)).torch_function)
        parameters = signature.parameters
        names = {cls.PROMPT.parameter(name): name for name in (*cls.TOKEN_AXES, *cls.arguments())}
        names.setdefault(cls.PROMPT.parameter(ENTERING_STATE), ENTERING_STATE)
        merged: dict[str, Any] = {}
        segments = self.segments()
        for parameter in parameters.values():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            name = names.get(parameter.name, parameter.name)
            if name in cls.TOKEN_AXES:
                pieces = []
                for segment in segments:
                    with self.in_segment(segment):
                        pieces.append(self.as_prompt_argument(name, self.argument(name)))
                present = [piece for piece in pieces if piece is not None]
                merged[parameter.name] = torch.cat(present, dim=cls.TOKEN_AXES[name]) if present else None
                continue
            with self.in_segment(segments[0]):
                found = self.argument(name)
                merged[parameter.name] = (
                    found if segments[0].located.call is cls.PROMPT else self.as_prompt_argument(name, found)
                )
        bound = signature.bind(**merged)
        return bound.args, bound.kwargs

    def as_prompt_argument(self, name: str, value: Any) -> Any:
        """The segment being read's argument ``name`` laid out as the prompt's kernel takes it.

        The prompt's own are; a decode kernel's tensor missing the tokens axis
        (a one-token update) gains it at ``TOKEN_AXES[name]``. A kind whose
        decode kernel lays an argument out otherwise says so here.
        """
        if not self.decoding() or name not in type(self).TOKEN_AXES or not isinstance(value, torch.Tensor):
            return value
        axis = type(self).TOKEN_AXES[name]
        with self.in_segment(self.segments()[0]):
            prompt_rank = self.argument(name).dim() if self.kernel_call() is type(self).PROMPT else None
        if prompt_rank is not None and value.dim() == prompt_rank:
            return value
        return value.unsqueeze(axis)

    def kernel_call_argument(self, name: str) -> BoundArgument:
        """The ``select`` of argument ``name`` of the kernel call that fires: found by its pure-torch kernel's signature."""
        located = self.located()
        torch_function = callee(bound_kernel(self._module, located)).torch_function
        return BoundArgument(_signature(torch_function), located.call.parameter(name))

    def argument(self, name: str, arguments: tuple[tuple, dict] | None = None) -> Any:
        """The argument ``name`` of the kernel call that fires (of ``arguments``, else of the call's recorded ones).

        Found by the kernel's own signature; ``None`` when the kernel takes no
        such parameter (a prompt's scan that starts from zeros takes no state).
        """
        return self.kernel_call_argument(name).pick(self.call_arguments() if arguments is None else arguments)

    def call_arguments(self) -> tuple[tuple, dict]:
        """The ``(args, kwargs)`` of the kernel call that fires on this call of the mixer, read once per call.

        A copy of the state the call starts from is taken with them
        (``entering_state``): they are first read at the call's start, before
        anything overwrites that state.
        """
        segment = self.current_segment()
        if segment is not None:
            operation = self._call_operation()
            return self.recorded(type(operation).inputs._location(operation))
        if self.segmented():
            arguments = per_call(self, "arguments", self.merged_arguments)
        else:
            arguments = per_call(self, "arguments", lambda: self._call_operation().inputs)
        per_call(self, "entering_state", lambda: self._copied_state(arguments))
        return arguments

    def replaced(self, location: str, value: Any) -> None:
        """An assignment to the kernel call's arguments replaces the recorded ones: what is computed from them follows.

        Called while the model waits at the call, before the kernel runs, so the
        entering state is copied again from the new arguments.
        """
        if not location.startswith(f"{self.path}.source."):
            return  # the module's own input or output: not an argument of a call inside its forward
        call = self._call_operation()
        if location != type(call).inputs._location(call):
            return
        replace_per_call(self, "arguments", value)
        replace_per_call(self, "entering_state", self._copied_state(value))

    def entering_state(self) -> torch.Tensor | None:
        """The state this call starts from as its kernel received it (``KernelCall.entering_state``), or ``None`` for zeros.

        A copy taken at the call's start: the kernel receives the cache's
        buffer, which the forward overwrites with the call's final state, so
        what is computed from the call's arguments afterwards
        (``state_trajectory`` read after ``attention_output``) starts from
        this. It follows an assignment to the state argument (``state_input``).
        """
        self.call_arguments()
        return per_call(self, "entering_state", lambda: None)

    def _copied_state(self, arguments: tuple[tuple, dict]) -> torch.Tensor | None:
        # the cache's buffer, which the forward overwrites with the call's final state
        state = self.argument(ENTERING_STATE, arguments)
        return None if state is None else state.clone()

    def skip_call(self, output: Any) -> None:
        """Inside a trace, once the call's arguments are read: skip the kernel call that fires, ``output`` returned in
        its place."""
        self._call_operation().skip(output)

    def _call_operation(self) -> Any:
        """The operation envoy of the kernel call that fires on this call of the mixer."""
        node: Any = self
        for label in self.located().path:
            node = getattr(node.source, label)
        return node

    # -- inside the kernel --------------------------------------------------------------------------

    def kernel_body(self) -> str:
        """The path to the operations inside the body of the kernel call that fires, for a key.

        ``<call>.source`` where the name is bound to the pure-torch function
        (routed, or transformers' plain function); one call deeper where it is
        bound to transformers' hub dispatcher, whose wrapper runs the body at
        its call of the implementation. The call's arguments are read first:
        once the worker is inside the kernel they are behind it, and a later
        value of the same call may need them (``call_arguments``).
        """
        self.call_arguments()
        return self._body_path()

    def _body_path(self) -> str:
        """``kernel_body``'s path, without reading the call's arguments first."""
        hop = self._dispatcher_hop()
        body = f"{self.located().key}.source"
        return body if hop is None else f"{body}.{hop}.source"

    def _dispatcher_hop(self) -> str | None:
        """The label of the dispatcher's call of the implementation, where the kernel's name is bound to transformers'
        hub dispatcher; ``None`` where it is bound to the body itself."""
        dispatched = callee(bound_kernel(self._module, self.located()))
        if dispatched.function is dispatched.torch_function:
            return None
        return DISPATCHED.find(ForwardSource.of(dispatched.function)).label

    def _body_operation(self) -> Any:
        """The operation envoy whose ``.source`` is the kernel's body: the call, or the dispatcher's call inside it."""
        call = self._call_operation()
        hop = self._dispatcher_hop()
        return call if hop is None else getattr(call.source, hop)

    def body_source(self) -> ForwardSource:
        """The source of the pure-torch body the kernel call that fires runs (routed: the function routing bound)."""
        return ForwardSource.of(callee(bound_kernel(self._module, self.located())).torch_function)

    def inside(self, place: str, attribute: str = "output") -> str:
        """The key of the place ``place`` (a name in the firing kernel call's ``reads``) inside its body: ``.<attribute>``."""
        operation = self.kernel_call().reads[place].find(self.body_source())
        return f"{self.kernel_body()}.{operation.label}.{attribute}"

    # -- the call's length and its per-token states -------------------------------------------------------

    def call_length(self) -> int:
        """This call's sequence length, from the kernel call's recorded arguments (``_seq``)."""
        return self._seq(*self.call_arguments())

    def _seq(self, args: tuple, kwargs: dict) -> int:
        """The kernel call's sequence length: one token on a decode step (whose update may take no sequence axis),
        else ``_prompt_length``."""
        return 1 if self.decoding() else self._prompt_length(args, kwargs)

    def _prompt_length(self, args: tuple, kwargs: dict) -> int:
        """A prompt kernel call's sequence length: its first argument's axis 1 (tokens-first tensors)."""
        return args[0].shape[1]

    def token_state_label(self) -> str:
        """The label of the state after each token inside the kernel that fires (its declared ``token_state``)."""
        declared = self.kernel_call()
        return declared.token_state.find(self.body_source()).label

    def _token_op(self) -> tuple[Any, int, int]:
        """(the state operation, the occurrence of it that is this call's first token, this call's length), once per call.

        Occurrences are counted per location since the kernel was drilled this
        run, so ``first`` is the operation's count at the moment the kernel's
        arguments are read: the worker is parked at the call's start, and the
        count is the number of tokens earlier calls put through it.
        """

        def locate() -> tuple[Any, int, int]:
            body = self._body_operation()
            seq = self.call_length()
            name = self.token_state_label()
            first = Mediator.current(name).occurrence(f"{body.path}.source.{name}.output")
            return getattr(body.source, name), first, seq

        return per_call(self, "call", locate)

    # -- a decode step's state, and its write-back ----------------------------------------------------

    def updated_state(self) -> torch.Tensor:
        """The cache's state buffer a decode kernel updates in place (its entering state).

        Once the decode kernel has returned, the buffer holds the state after
        the step: where ``state_output`` is read on a decode step, after every
        value inside the kernel, so that one order of reads holds on prompts and
        decode steps alike.
        """
        return self.argument(ENTERING_STATE)

    def reads_state_after_the_update(self) -> bool:
        """Whether a decode step's ``state_output`` is read once the kernel has returned, rather than inside it.

        Inside (at the binding of the new state, before the kernel computes
        its output) unless the head outputs, which come after it, were read
        first in this call: then from the cache's buffer the kernel updated in
        place (``updated_state``). Both orders of the two thus work.
        """
        furthest = self._peek("furthest")
        head_outputs = self._stage("attention_head_outputs")
        return furthest is not None and (furthest.stage > head_outputs or "attention_head_outputs" in furthest.names)

    def write_updated_state(self, value: torch.Tensor, layout: Callable) -> None:
        """Copy ``value``, in the standard ``layout``, into the decode kernel's state buffer.

        What a decode step's ``state_output`` write does once the kernel has
        returned: the next step starts from the buffer, and this step's output
        is already computed.
        """
        with torch.no_grad():
            layout(self.updated_state()).copy_(value)

    def read_state_output(self, value: Any, layout: Callable) -> torch.Tensor:
        """``state_output`` as read from ``value`` served at its place: the kernel's final state, or on a decode step a copy.

        On a decode step the copy is of the new state inside the update, or of
        the cache's buffer once the update returned (``reads_state_after_the_update``).
        """
        if not self.decoding():
            return layout(value)
        if self.reads_state_after_the_update():
            buffer = self.updated_state()
            return self.serve_state(buffer, layout, buffer=buffer)
        return self.serve_state(value, layout)

    def place_state_output(self, value: torch.Tensor, layout: Callable) -> Any:
        """What an assigned ``state_output`` puts at its place: the state in the kernel's layout, or, once a decode
        kernel returned, its unchanged output, the state having been copied into the cache's buffer."""
        if not (self.decoding() and self.reads_state_after_the_update()):
            return layout(value)
        self.write_updated_state(value, layout)
        return self._call_operation().output

    @staticmethod
    def serve_state(state: torch.Tensor, layout: Callable, buffer: torch.Tensor | None = None) -> torch.Tensor:
        """A copy of a kernel's state in the standard ``layout`` (the identity, or a swap of the last two axes).

        A copy because the cache overwrites the state in place on later
        steps. It remembers where it came from, so that an in-place edit goes
        back (:meth:`write_back_state`): into ``buffer`` when given (the
        cache's, after the kernel returned), else in place of the kernel's own
        tensor.
        """
        served = layout(state).clone()
        setattr(served, SERVED_FROM, (buffer, layout))
        return served

    @staticmethod
    def write_back_state(served: torch.Tensor, element: Any) -> Any:
        """The write-back of a state read through :meth:`serve_state`: what goes back at its place, edits included.

        Runs where nnsight flushes an edited view, when the worker may already
        be pinned to another step, so it needs nothing but the served tensor.
        A state served as the kernel's own tensor (or a view of it) was edited
        in place already.
        """
        buffer, layout = getattr(served, SERVED_FROM, (None, None))
        if layout is None:
            return element
        if buffer is None:
            return layout(served)
        with torch.no_grad():
            layout(buffer).copy_(served)
        return element


@functools.cache
def _signature(function: Callable) -> inspect.Signature:
    return inspect.signature(function)
