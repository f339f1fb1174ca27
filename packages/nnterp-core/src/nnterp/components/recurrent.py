"""RecurrentMixer: what every recurrent mixer shares, whatever its values are.

A recurrent mixer (a gated DeltaNet, a Mamba-1 or a Mamba-2 layer) runs its
sequence through a kernel function its modeling module calls: a prompt's kernel
(chunked, or a scan) and a decode step's kernel (one token over the cached
state). Its values are the arguments and results of that call, so reaching them
takes four things, one module each:

- which kernel fires on this call of the mixer, decided by the forward's own
  test, once per call (``RecurrentMixer.kernel_call``, :mod:`.per_call`);
- the kernel call itself, declared as a :class:`~.kernels.KernelCall` whose
  arguments are found by the kernel's own signature, and kernels with Python
  source to read inside: transformers' pure-torch ones (:mod:`.kernels`);
- how the mixer kind gets the state after every token (:mod:`.per_token`),
  which ``route_kernels`` (:mod:`.routing`) reads to bind a family's kernel
  names process-wide;
- the state after every token, one occurrence per token of an operation inside
  that kernel, read and written by occurrence arithmetic, or computed from the
  call's arguments (``trajectory``): this module's ``RecurrentMixer``.

The order a call's values come in, and refusing one the forward has passed, is
:mod:`.call_order`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from nnsight.intervention.interleaver import Mediator

from ..analysis.mixing import Heads, TokenMixing, select_heads
from ..descriptor import DerivedEProperty, EProperty, Unavailable, inside_trace
from ..layouts import MIXER_HEADS, Mixing, Residual, State, States
from ..order import OrderError, standard_path
from ..positions import Positions, select_positions
from .call_order import CallOrder
from .kernels import (
    ENTERING_STATE,
    INSTRUMENTED,
    KernelCall,
    bound_kernel,
    dispatch,
    forward_arguments,
    needs_kernel_call,
)
from .per_call import per_call, pinned, replace_per_call
from .per_token import PerToken, needs_recurrent_routing
from .standard import Sublayer, axis_size, contribution

#: The attribute of a served state copy holding (the buffer it goes back into or ``None``, its layout), for the
#: write-back of an in-place edit.
SERVED_FROM = "_nnterp_served_from"


def needs_token_place(envoy: "RecurrentMixer") -> str | None:
    """Why ``state``, one place per token, is unavailable on ``envoy``, or ``None``: no per-token states, or a forward
    binding each token's state once per kernel call (``CALLS_PER_FORWARD``)."""
    reason = needs_recurrent_routing(envoy)
    if reason is not None:
        return reason
    calls = envoy.calls_per_forward()
    if calls == 1:
        return None
    return (
        f"{type(envoy._module).__name__}'s forward calls its kernel {calls} times, once per head "
        f"({type(envoy).CALLS_PER_FORWARD}={calls}), each binding its own channels' state after every token, so the "
        f"state after a token is not one place tracer.iter can step to; read states or state_after(t), and write "
        f"set_state_after(t, value), instead"
    )


class RecurrentMixer(CallOrder, Sublayer):
    """A sequence mixer with a recurrent state, read at the kernel call its forward makes.

    A subclass declares its two kernel calls and how it gets the state after
    every token, then its values at ``kernel("inputs")`` with
    ``select=argument(name)`` (an argument found by the kernel's signature) or
    ``kernel("output")``, with ``unavailable=needs_torch_kernels``, and the
    math of ``states_from_arguments``:

    - ``PROMPT``: the :class:`~.kernels.KernelCall` a prompt runs through;
      ``DECODE``: the one a decode step of ``generate`` runs through (the
      update of the cached state by one token).
    - ``PER_TOKEN``: how the state after every token is had
      (:mod:`.per_token`: a token loop the prompt is routed to, the scan's own
      loop, or chunk boundaries one token apart).
    - ``CALLS_PER_FORWARD``: where the forward makes its kernel call more than
      once (Zamba's scan, once per Mamba head in a loop), the module attribute
      counting the calls. Each call is over a slice of the state's axis 1,
      one after the other, so a subclass declaring it reads the values where
      the forward holds every head's at once (its ``call_arguments``), and
      the state after token ``t`` is that of every call in turn: occurrence
      ``first + call * seq + t`` of the token loop's state, joined along axis
      1 by ``states``, ``state_after`` and ``set_state_after``; ``state``,
      one place per token, is then unavailable.

    - ``BRANCH``: the binding the forward makes before it picks a kernel,
      ``True`` when the call continues a cached state; ``SEQ_OP``: the masking
      of its input, once per call, with the call's length on axis 1. A
      transformers version whose forward binds no such flag (5.23 on) tests the
      cached state itself; then the decision reads the call's own arguments and
      ``CACHED_STATE``, the binding of the cached state made when a cache is
      passed.
    - ``ORDER`` (and ``DECODE_ORDER`` where a decode step differs): the
      values inside one call in the order the forward produces them. A value
      asked for after a later one of the same call raises
      :class:`~nnterp.OrderError` before the worker waits; ``states`` read
      after the token loop passed are computed from the call's arguments.

    ``kernel_call`` picks the call that fires on this call of the mixer, once per
    call, so the same values work in a trace and on every step of
    ``tracer.iter``. With ``PER_TOKEN`` in effect (``route_kernels(model.family,
    "torch")`` for a token loop), ``states`` and ``state_after`` reach every
    position, and on a token loop ``state`` and ``set_state_after`` too;
    ``state_trajectory`` computes them from the call's arguments, always.
    """

    BRANCH: str = "use_precomputed_states_0"
    SEQ_OP: str = "apply_mask_to_padding_states_0"
    CACHED_STATE: str = "recurrent_state_0"
    PROMPT: KernelCall
    DECODE: KernelCall
    PER_TOKEN: PerToken
    #: The mixer module's attribute counting the kernel calls one forward makes, where the forward calls its kernel
    #: in a loop (``"n_mamba_heads"``); ``None``: once per forward.
    CALLS_PER_FORWARD: str | None = None
    #: The layout axis ``token_mixing`` has a row per: the state's heads, or Mamba-1's channels.
    MIXING_HEADS: str = MIXER_HEADS
    #: The call inside transformers' hub dispatcher wrapper that runs the kernel's body.
    DISPATCHED: str = "implementation_0"

    @property
    def source(self) -> Any:
        """nnsight's ``.source``, recording that this mixer's forward is compiled (route_kernels warns about it)."""
        source = super().source
        INSTRUMENTED.add(self._module)
        return source

    @classmethod
    def calls(cls) -> tuple[KernelCall, KernelCall]:
        """The mixer's two kernel calls: the prompt's and the decode step's."""
        return cls.PROMPT, cls.DECODE

    def calls_per_forward(self) -> int:
        """How many kernel calls one forward of this mixer makes, one after the other (``CALLS_PER_FORWARD``)."""
        attribute = type(self).CALLS_PER_FORWARD
        return 1 if attribute is None else getattr(self._module, attribute)

    def kernel_call(self) -> KernelCall:
        """The kernel call that fires on this call of the mixer (``PROMPT`` or ``DECODE``), decided once per call.

        The forward's own test: the token-by-token update for one token over a
        cached state, the prompt's kernel for everything else (several tokens
        over a cached state included). Bindings are read in the order the
        forward makes them, by source line.
        """
        cls = type(self)

        def choose() -> KernelCall:
            source = self.source
            lines = source.compiled.lines
            if cls.BRANCH in lines:
                served = {}
                for name in sorted((cls.BRANCH, cls.SEQ_OP), key=lines.__getitem__):
                    served[name] = getattr(source, name).output
                continues = bool(served[cls.BRANCH])
                seq = served[cls.SEQ_OP].shape[1]
            else:
                hidden, cache = forward_arguments(self.inputs)
                seq = hidden.shape[1]
                continues = cache is not None and seq == 1 and getattr(source, cls.CACHED_STATE).output is not None
            return cls.DECODE if continues and seq == 1 else cls.PROMPT

        return per_call(self, "kernel", choose)

    def decoding(self) -> bool:
        """Whether this call of the mixer is a decode step (the update over the cached state) rather than a prompt."""
        return self.kernel_call() is type(self).DECODE

    def argument(self, name: str, arguments: tuple[tuple, dict] | None = None) -> Any:
        """The argument ``name`` of the kernel call that fires (of ``arguments``, else of the call's recorded ones).

        Found by the kernel's own signature; ``None`` when the kernel takes no
        such parameter (a prompt's scan that starts from zeros takes no state).
        """
        return self.kernel_call().argument(self, name).pick(self.call_arguments() if arguments is None else arguments)

    def call_arguments(self) -> tuple[tuple, dict]:
        """The ``(args, kwargs)`` of the kernel call that fires on this call of the mixer, read once per call.

        A copy of the state the call starts from is taken with them
        (``entering_state``): they are first read at the call's start, before
        anything overwrites that state.
        """
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

    def _call_operation(self) -> Any:
        """The operation envoy of the kernel call that fires on this call of the mixer."""
        return getattr(self.source, self.kernel_call().label)

    def kernel_body(self, label: str) -> str:
        """The path to the operations inside the body of kernel ``label``, for a key.

        ``source.<label>.source`` where the name is bound to the pure-torch
        function (routed); one call deeper where it is still bound to
        transformers' hub dispatcher, whose wrapper calls the body as
        ``DISPATCHED``. The call's arguments are read first: once the worker is
        inside the kernel they are behind it, and a later value of the same
        call may need them (``call_arguments``).
        """
        self.call_arguments()
        return self._body_path(label)

    def _body_path(self, label: str) -> str:
        """``kernel_body``'s path, without reading the call's arguments first."""
        bound = bound_kernel(self, label)
        body = f"source.{label}.source"
        return body if bound is dispatch(bound).torch_function else f"{body}.{self.DISPATCHED}.source"

    # -- what the mixer adds -----------------------------------------------------

    @EProperty(contribution)
    def attention_output(self, value: Any) -> Residual:
        """What the mixer adds to the residual stream, [batch, seq, hidden_size].

        The module's own output, or where the block changes it on the way in
        (``CONTRIBUTION``). Assign or edit in place.
        """
        return value

    # -- the state after every token ----------------------------------------------

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

    def _token_op(self) -> tuple[Any, int, int]:
        """(the state operation, the occurrence of it that is this call's first token, this call's length), once per call.

        Occurrences are counted per location since the kernel was drilled this
        run, so ``first`` is the operation's count at the moment the kernel's
        arguments are read: the worker is parked at the call's start, and the
        count is the number of tokens earlier calls put through it.
        """

        def locate() -> tuple[Any, int, int]:
            declared = self.kernel_call()
            call = getattr(self.source, declared.label)
            seq = self.call_length()
            name = declared.token_state
            first = Mediator.current(name).occurrence(f"{call.path}.source.{name}.output")
            return getattr(call.source, name), first, seq

        return per_call(self, "call", locate)

    def _token_state_op(self) -> str:
        """The key of ``state``: the state operation inside the kernel that fires, drilled into before the call runs."""
        # under tracer.iter the worker is pinned to a token, not to this call: the call is decided relaxed
        with pinned(None):
            call = self.kernel_call()
            self.call_arguments()
            getattr(self.source, call.label).source
        return f"source.{call.label}.source.{call.token_state}.output"

    @EProperty(_token_state_op, unavailable=needs_token_place)
    def state(self, value: Any) -> State:
        """The state after a token of this call, one occurrence per token; needs route_kernels(family, 'torch').

        A place inside the token-by-token kernel, so nnsight's own
        ``tracer.iter`` walks it: ``for t in tracer.iter[:n]: mix.state`` is the
        state after every token, and an assignment at ``tracer.iter[t]`` is the
        state tokens ``t+1..`` continue from (token ``t``'s own output reads it
        too). Outside ``tracer.iter`` it is the state after the call's first
        token.
        """
        return value

    def _states(self) -> States:
        """The state after every token of this call, [batch, seq, heads, key_dim, value_dim]; needs route_kernels(family, 'torch').

        Read before the forward reaches them, the states the model itself
        binds (``per_token_states``); after (a later value of the call was read
        first), computed from the call's arguments as ``state_trajectory`` is.
        """
        if self._token_passed(0):
            return self._recomputed("states", None)
        return self.per_token_states()

    def per_token_states(self) -> States:
        """Every token's state as the model binds it: one occurrence per token of ``token_state``, gathered as they come.

        Where the forward makes several kernel calls (``CALLS_PER_FORWARD``),
        each call's tokens in turn, its states a slice of axis 1.
        """
        op, first, seq = self._token_op()
        calls = self.calls_per_forward()
        states = None
        for call in range(calls):
            for t in range(seq):
                with pinned(first + call * seq + t):
                    state = op.output
                if states is None:
                    width = state.shape[1]
                    states = state.new_empty((state.shape[0], seq, width * calls, *state.shape[2:]))
                # Copied into one buffer as they come, so the kernel's per-token tensors are freed
                # and reused rather than kept until a final stack.
                states[:, t, call * width : (call + 1) * width] = state
            self.passing_call(call)
        return states

    def passing_call(self, call: int) -> None:
        """Read what kernel call ``call`` of this forward binds after its tokens, before the next call's tokens pass it.

        Called where the per-token states move on from one of the forward's
        kernel calls to the next (``CALLS_PER_FORWARD``); by default nothing.
        """

    states = DerivedEProperty(_states, unavailable=needs_recurrent_routing)

    def trajectory(self, positions: Positions = None, dtype: torch.dtype | None = None) -> States:
        """The state after chosen tokens of this call, [batch, positions, ...the state's axes], computed from its arguments.

        ``state_trajectory`` with a selection: ``positions`` indexes the call's
        tokens as ``states[:, positions]`` would (an int, a slice, a list; an
        int drops the axis) and only those states are computed. The call's
        arguments are read at the kernel call and the states computed beside
        it in pure torch by the family's chunked recurrence
        (``states_from_arguments``), so it needs neither routing nor
        ``chunk_per_token``, and works with an optimized kernel installed. The
        dtype is the kernel's unless ``dtype`` says otherwise.

        It reads the call's arguments as assigned (an assigned key, gate or
        ``state_input`` is in it), so it can be read before or after the call's
        other values; a call over a cached state starts from a copy of it
        taken before the forward overwrites it (``entering_state``). No
        gradient flows through it: the computation writes into its result in
        place, which autograd refuses.
        """
        inside_trace(self, "trajectory()")
        with torch.no_grad():
            return self.states_from_arguments(positions, dtype)

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> States:
        """The family's math: the states after ``positions`` of this call, from its arguments (see ``trajectory``)."""
        raise NotImplementedError(f"{type(self).__name__} declares no states_from_arguments")

    def token_mixing(self, positions: Positions = None, heads: Heads = None) -> Mixing:
        """The exact token-to-token matrix of this call: how each output row mixes the call's values, [batch, heads, rows, seq].

        ``M[b, h, t, j]`` is how much of token ``j``'s value (``attention_values``)
        head ``h`` puts into token ``t``'s head output: the mixer is linear in its
        values once its queries, keys and gates are fixed
        (:mod:`nnterp.analysis.mixing`), and ``M`` is that linear map with
        nothing dropped (the delta rule's key removal included), so
        ``mixed(M, attention_values) + mixing_offset() == attention_head_outputs``
        to float rounding. On Mamba-1 the heads are its channels. Computed in
        float32 from the kernel call's arguments, like ``trajectory``: no routing
        needed, beside an optimized kernel too; it follows assigned arguments.

        ``positions`` picks the query rows as ``states[:, positions]`` would and
        only those are computed; ``heads`` picks heads as ``M[:, heads]`` would
        (an int drops the axis either way). A decode step's matrix is one row by
        one column: what it inherits from the prompt is in the offset.
        """
        return self._mixing("token_mixing", positions, heads).matrix

    def mixing_offset(self, positions: Positions = None, heads: Heads = None) -> torch.Tensor:
        """What this call's head outputs hold besides ``token_mixing``'s mix of its values, in their layout.

        The readout of the state the call started from (zero on a prompt from
        zeros) and the family's skip term (``D * x`` on Mamba), at the rows and
        heads ``positions`` and ``heads`` pick: ``attention_head_outputs`` is
        ``mixed(token_mixing(), attention_values) + mixing_offset()``.
        """
        return self._mixing("mixing_offset", positions, heads).offset

    def read_state(self, state: torch.Tensor, positions: Positions = None) -> torch.Tensor:
        """What this call's head outputs at ``positions`` would be, each reading ``state`` instead of its own state.

        The mixer's own readout (a gated DeltaNet's scaled query, a Mamba's
        ``C`` and skip term) applied to ``state``, in the layout of
        ``state_output`` (``[batch, heads, ...]``): asks "what would this state
        answer at token t". Returns ``attention_head_outputs``' layout at those
        rows (an int drops the axis), float32; ``read_state(state_after(t), t)``
        is the head output at ``t`` itself. Computed from the kernel call's
        arguments, like ``token_mixing``.
        """
        rows, order, single = self._rows_of_call("read_state", positions)
        with torch.no_grad():
            outputs = self.readout_from_arguments(state.float(), rows)
        if order is not None:
            outputs = outputs[:, order]
        return outputs[:, 0] if single else outputs

    def readout_from_arguments(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The family's math: the head outputs at ``rows`` of this call, each reading ``state`` (float32), from its arguments."""
        raise NotImplementedError(f"{type(self).__name__} declares no readout_from_arguments")

    def _rows_of_call(self, what: str, positions: Positions) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """``select_positions`` over this call's tokens, for ``what``, a value computed from the call's arguments.

        Raises:
            ValueError: outside a trace.
            nnterp.Unavailable: the forward makes no such kernel call (``needs_kernel_call``).
        """
        inside_trace(self, f"{what}()")
        reason = needs_kernel_call(self)
        if reason is not None:
            raise Unavailable(f"{what} on {standard_path(self)}: {reason}")
        return select_positions(positions, self.call_length())

    def _mixing(self, what: str, positions: Positions, heads: Heads) -> TokenMixing:
        rows, order, single_row = self._rows_of_call(what, positions)
        chosen, single_head = select_heads(heads, axis_size(self, type(self).MIXING_HEADS))
        with torch.no_grad():
            matrix, offset = self.mixing_from_arguments(rows, chosen)
        if order is not None:
            matrix, offset = matrix[:, :, order], offset[:, order]
        if single_row:
            matrix, offset = matrix[:, :, 0], offset[:, 0]
        if single_head:
            # the offset's heads axis follows its rows axis, or takes its place once an int row dropped it
            matrix, offset = matrix[:, 0], offset.select(1 if single_row else 2, 0)
        return TokenMixing(matrix, offset)

    def mixing_from_arguments(self, rows: torch.Tensor, heads: torch.Tensor) -> TokenMixing:
        """The family's math: the token mixing at ``rows`` (sorted, distinct positions) and ``heads`` (indices), float32.

        From the kernel call's arguments (``argument``) and the state it started
        from (``entering_state``): a :class:`~nnterp.analysis.mixing.TokenMixing`
        whose matrix is ``[batch, heads, rows, seq]`` and whose offset is the head
        outputs' layout at those rows and heads.
        """
        raise NotImplementedError(f"{type(self).__name__} declares no mixing_from_arguments")

    def _state_trajectory(self) -> States:
        """The state after every token of this call, [batch, seq, ...the state's axes], from the kernel call's arguments; no routing needed."""
        return self.trajectory()

    state_trajectory = DerivedEProperty(_state_trajectory, unavailable=needs_kernel_call)

    def _token_passed(self, t: int) -> bool:
        """Whether the forward is past the state after token ``t`` of this call (``0 <= t < seq``).

        It is when a later value of the call was read, the call has returned,
        or the token loop has already bound that token's state.
        """
        furthest = self._peek("furthest")
        if furthest is not None and furthest.stage > self._stage("states"):
            return True
        if self._returned():
            return True
        located = self._peek("call")
        if located is None:
            return False
        op, first, _ = located
        return Mediator.current("states").occurrence(type(op).output._location(op)) > first + t

    def _recomputed(self, what: str, positions: Any) -> State:
        """States the token loop has already passed, computed from the call's arguments as ``trajectory`` does.

        Exact but for float rounding, unless a state was written in this call:
        the arguments do not know of that write, so it raises instead.
        """
        if self._peek("state written"):
            raise OrderError(
                f"{what} on {standard_path(self)}: the token loop has passed these positions, and a state was written "
                f"in this call, which a recomputation from the call's arguments would miss; read them before the "
                f"write's later positions are produced, or in a trace of their own"
            )
        return self.trajectory(positions=positions)

    def _position(self, method: str, t: int) -> int:
        """Token ``t`` of this call as a position in [0, seq), checked: inside a trace, routed, in range."""
        inside_trace(self, f"{method}({t})")
        reason = type(self).states.reason(self)
        if reason is not None:
            raise Unavailable(f"{method} on {standard_path(self)}: {reason}")
        self.check_order("states")
        seq = self.call_length()
        if not -seq <= t < seq:
            raise IndexError(
                f"{method}({t}) on {standard_path(self)}: this call has {seq} token(s), so t is in [{-seq}, {seq})"
            )
        return t % seq

    def state_after(self, t: int) -> State:
        """The state after token ``t`` of this call (counted from the call's own first token, as on a decode step).

        Read before the token loop reaches ``t``, it is the loop's own state;
        after (a later position or value of the call was read first), it is
        computed from the call's arguments, as ``trajectory(positions=t)``.
        """
        position = self._position("state_after", t)
        if self._token_passed(position):
            return self._recomputed(f"state_after({t})", position)
        op, first, seq = self._token_op()
        pieces = []
        for call in range(self.calls_per_forward()):
            with pinned(first + call * seq + position):
                pieces.append(op.output)
            self.passing_call(call)
        self.record_order("states")
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)

    def set_state_after(self, t: int, value: torch.Tensor) -> None:
        """Assign the state after token ``t``: the tokens after it continue from ``value``.

        ``value`` must have the state's shape ([batch, heads, key_dim,
        value_dim]). Reads follow the forward: in one trace, read positions
        before ``t`` before the write and positions after it afterwards
        (``states``, which reads every position, only before it). A write to
        a position the loop has passed raises :class:`OrderError`.
        """
        position = self._position("set_state_after", t)
        if self._token_passed(position):
            furthest = self._peek("furthest")
            after = f" after {furthest.last}" if furthest is not None else ""
            raise OrderError(
                f"set_state_after({t}) on {standard_path(self)}: the token loop has already passed token {t}{after}, "
                f"so the write could not reach the tokens after it; write the state before reading states or any "
                f"later position or value of this call ({self.order_hint('set_state_after')})"
            )
        op, first, seq = self._token_op()
        calls = self.calls_per_forward()
        for call, piece in enumerate(value.chunk(calls, dim=1) if calls > 1 else (value,)):
            with pinned(first + call * seq + position):
                if call == 0:
                    current = op.output
                    if calls > 1:  # each call binds a slice of axis 1
                        current = current.new_empty(
                            (current.shape[0], current.shape[1] * calls, *current.shape[2:]), device="meta"
                        )
                    type(self).state.check_layout(self, current, value)
                op.output = piece
            self.passing_call(call)
        self.record_order("states", written=True)
