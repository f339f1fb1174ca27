"""RecurrentMixer: what every recurrent mixer shares, whatever its values are.

A recurrent mixer (a gated DeltaNet, a Mamba-1 or a Mamba-2 layer) runs its
sequence through kernel functions its modeling module calls: a prompt's kernel
(chunked, or a scan) and a decode step's kernel (one token over the cached
state). Its values are the arguments and results of those calls. A mixer kind
is a declaration plus its math, one module each:

- the declaration (:mod:`.declaration`): its two :class:`~.declaration.KernelCall`
  s, by the functions the forward calls and the names their bodies bind, found
  in the installed forward by :func:`~.declaration.forward_layout`;
- how the kind gets the state after every token (:mod:`.per_token`), which
  ``route_kernels`` (:mod:`.routing`) reads to bind a family's kernel names
  process-wide;
- the order a call's values come in, and refusing one the forward has passed
  (:mod:`.call_order`);
- the call site (:mod:`.call_site`): which kernel fires on a call, its recorded
  arguments and entering state, the states inside the kernel, and their
  write-back;
- this module's ``RecurrentMixer``: the values every kind shares, the state
  after every token (one occurrence per token of an operation inside the
  kernel, read and written by occurrence arithmetic, or computed from the
  call's arguments by the kind's math: ``trajectory``) and token mixing.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from nnsight.intervention.interleaver import Mediator

from ..analysis.knockout import knocked_tokens
from ..analysis.mixing import Heads, TokenMixing, select_heads
from ..availability import Unavailable, inside_trace
from ..descriptor import DerivedEProperty, EProperty
from ..layout_checks import check_layout
from ..layouts import MIXER_HEADS, Mixing, Residual, State, States
from ..order import OrderError, standard_path
from ..positions import Positions, select_positions
from .call_order import CallOrder
from .call_site import CallSite, needs_kernel_call
from .per_call import pinned, replace_per_call
from .per_token import PerToken, needs_recurrent_routing
from .standard import Sublayer, axis_size, contribution
from .states_memory import reusable_states


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


class AdjointRoute(NamedTuple):
    """A call's backward routed through its recurrence's adjoint (``RecurrentMixer.backward_through_adjoint``)."""

    #: the head outputs the forward goes on with, as ``attention_head_outputs`` serves them: their gradient is the
    #: one the call's backward starts from
    head_outputs: torch.Tensor
    #: zeros, ``[batch, seq, heads]``, whose gradient after the backward is the estimate of patching another run's
    #: states into this one (``RecurrentMixer.state_patch_estimates``), or ``None`` where none was asked for
    state_patch_estimates: torch.Tensor | None


class RecurrentMixer(CallSite, CallOrder, Sublayer):
    """A sequence mixer with a recurrent state, read at the kernel call its forward makes.

    A subclass declares its two kernel calls and how it gets the state after
    every token, then its values at ``kernel("inputs")`` with
    ``select=argument(name)`` (an argument found by the kernel's signature) or
    ``kernel("output")``, with ``unavailable=needs_torch_kernels``, and the
    math of ``states_from_arguments``:

    - ``PROMPT``: the :class:`~.declaration.KernelCall` a prompt runs through;
      ``DECODE``: the one a decode step of ``generate`` runs through (the
      update of the cached state by one token), each by the function the
      forward calls, never by an operation label.
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

    PER_TOKEN: PerToken
    #: The layout axis ``token_mixing`` has a row per: the state's heads, or Mamba-1's channels.
    MIXING_HEADS: str = MIXER_HEADS
    #: What ``token_mixing`` with ``mixing_offset`` reconstructs: the head outputs ("exact"), or, where a normalizer
    #: divides them by a function of the values, the part before it, named.
    TOKEN_MIXING: str = "exact"
    #: The forward's argument that takes what one run leaves for the next, and the output field that returns it,
    #: where it is none of transformers' cache names (RWKV's ``state`` list); ``None``: a cache name.
    CARRIER: str | None = None

    # -- what the mixer adds -----------------------------------------------------

    @EProperty(contribution)
    def attention_output(self, value: Any) -> Residual:
        """What the mixer adds to the residual stream, [batch, seq, hidden_size].

        The module's own output, or where the block changes it on the way in
        (``CONTRIBUTION``). Assign or edit in place.
        """
        return value

    # -- the state after every token ----------------------------------------------

    def _token_state_op(self) -> str:
        """The key of ``state``: the state operation inside the kernel that fires, drilled into before the call runs."""
        # under tracer.iter the worker is pinned to a token, not to this call: the call is decided relaxed
        with pinned(None):
            if self.segmented():
                self.write_across_calls(type(self).state)
            self.call_arguments()
            self._body_operation().source
            return f"{self._body_path()}.{self.token_state_label()}.output"

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
        if self.segmented() or self._token_passed(0):
            return self._recomputed("states", None)
        return self.per_token_states()

    def per_token_states(self) -> States:
        """Every token's state as the model binds it: one occurrence per token of ``token_state``, gathered as they come.

        Where the forward makes several kernel calls (``CALLS_PER_FORWARD``),
        each call's tokens in turn, its states a slice of axis 1. States that
        record no gradient go into the memory this mixer's last ones took, once
        nothing refers to those (:func:`.states_memory.reusable_states`).
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
                    shape = (state.shape[0], seq, width * calls, *state.shape[2:])
                    states = (
                        state.new_empty(shape) if state.requires_grad else reusable_states(self._module, state, shape)
                    )
                # Copied into one buffer as they come, so the kernel's per-token tensors are freed and reused
                # rather than kept until a final stack; by copy_ into a view, as indexed assignment costs a
                # tenth of the token loop more.
                states.select(1, t).narrow(1, call * width, width).copy_(state)
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

    @classmethod
    def prompt_starts_from_zeros(cls) -> bool:
        """Whether the prompt kernel takes no entering state, so a call of several tokens over a cache starts from
        zeros (Mamba-1's scan), not from the cached state; a kind computing in its forward reads the cache itself."""
        return cls.PROMPT is not None and cls.PROMPT.entering_state is None

    @classmethod
    def prompt_continues_from_cache(cls) -> bool:
        """Whether a call of several tokens can continue from the state a cache holds: its prompt kernel takes an
        entering state, or the kind says what one adds (``entering_contribution``); otherwise a continuation runs
        one token at a time."""
        return (
            not cls.prompt_starts_from_zeros() or cls.entering_contribution is not RecurrentMixer.entering_contribution
        )

    def continue_from(self, state: torch.Tensor) -> None:
        """Inside a trace, on a prompt's call over a cache: make the call continue from ``state``, as a decode step
        continues from the cache's.

        A kernel that takes its entering state reads it from the cache, as a
        decode step does, and this does nothing. A prompt kernel that starts from zeros
        (``prompt_starts_from_zeros``: Mamba-1's scan) gets what ``state``
        ([batch, ...] as ``state_output``) adds to its head outputs and to the
        state it leaves (``entering_contribution``, a linear recurrence's
        readout of the decayed state), and the values computed from the
        call's arguments (``trajectory``, ``token_mixing``) start from
        ``state``. Read the call's values after this, not before.

        Raises:
            nnterp.Unavailable: the kind's prompt kernel starts from zeros and it
                does not say what an entering state adds.
        """
        if not type(self).prompt_starts_from_zeros() or self.decoding():
            return
        outputs, final = self.entering_contribution(state)
        self.call_arguments()
        replace_per_call(self, "entering_state", state)
        self.attention_head_outputs = self.attention_head_outputs + outputs.to(self.attention_head_outputs.dtype)
        self.state_output = self.state_output + final.to(self.state_output.dtype)

    def entering_contribution(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What entering this call with ``state`` adds to its head outputs and to the state after its last token.

        A kind whose prompt kernel starts from zeros declares it from the
        call's arguments (``continue_from`` adds it), laid out as
        ``attention_head_outputs`` and ``state_output``.
        """
        raise Unavailable(
            f"{standard_path(self)}: a {type(self).__name__} prompt call starts from zeros and its kind does not say "
            f"what a cached state adds to it; continue one token at a time"
        )

    def run_from_arguments(self, entering: torch.Tensor | None = None) -> torch.Tensor | None:
        """Inside a trace without gradients that reads nothing inside this call: run the prompt's call from its arguments.

        Computes what the kernel call would return from its arguments as they
        stand (a knocked-out key included), continuing from ``entering``
        ([batch, ...] as ``state_output``; ``None`` for the call's own start),
        and skips the kernel. Returns the head outputs it computed, as
        ``attention_head_outputs`` would have served them, or ``None`` where it
        did not run. A kind declares it where its pure-torch kernel is much
        slower than a computation of its own (Mamba-1's scan, whose kernel
        starts from zeros: this continues from the state itself); by default,
        on a decode step, with gradients and beside an optimized kernel, it
        does nothing. ``nnterp.analysis.knockout`` runs its rows so, and
        ``attribution_patch`` its corrupt run. Nothing inside the call can be
        read or written after it.
        """
        return None

    def backward_through_adjoint(self, corrupt: tuple[torch.Tensor, ...] | None = None) -> AdjointRoute | None:
        """Inside a trace that takes gradients: route this call's backward through its recurrence's adjoint.

        The forward goes on with the call's output, the kernel's or, where the
        kind computes the call from its arguments (Mamba-1), that one, equal to
        it to rounding; the path the gradient takes back through the call
        changes, to the adjoint computed from the call's arguments. A kind
        declares it where autograd's record of its pure-torch kernel costs more
        than the adjoint (Mamba-1's token loop, whose backward is quadratic in
        the prompt); by default, and beside an optimized kernel with its own
        backward, it does nothing. ``nnterp.analysis.attribution_patch`` calls
        it on every mixer of its clean run. Call it before reading the call's
        values, and read the head outputs from the route.

        ``corrupt`` is what ``state_patch_inputs`` read on another run of this
        call: the backward, which runs the adjoint anyway, then also estimates
        patching that run's states into this one, where the kind can.

        Returns the ``AdjointRoute`` where it routed (read the head outputs
        there, not again), else ``None``.
        """
        return None

    def carried(self) -> dict[str, torch.Tensor]:
        """Inside a trace, on a prompt's call: everything this mixer carries past the call's last token, by name.

        What ``nnterp.analysis.patch_state`` takes from the source's run up to
        token ``t`` and gives the target's continuation (``carry``): the state
        after the last token (``"state"``, as ``trajectory(positions=-1)``),
        and, where a kind carries more past a token (a token shift's last
        input, a normalizer, a convolution's window), each further part under
        its own name, [batch, ...]. Read in the forward's order: a kind adding
        parts reads them where its call makes them. Save each.
        """
        return {"state": self.trajectory(positions=-1)}

    def spliced_state(self, carried: dict[str, torch.Tensor], heads: Any) -> torch.Tensor:
        """The state after this call's last token with ``carried["state"]`` at ``heads``: what ``carry`` leaves.

        Computed from the call's arguments (``trajectory``): ``state_output``
        itself comes after the head outputs ``carry`` may write.
        """
        state = self.trajectory(positions=-1).clone()
        state[:, heads] = carried["state"].to(state)[:, heads]
        return state

    def carry(self, carried: dict[str, torch.Tensor], heads: Any) -> torch.Tensor:
        """Inside a trace, on a prompt's call: the next call continues from ``carried`` (``carried()``'s parts) at
        ``heads`` (the state's axis 1, as ``state[:, heads]``), as if the call's last token had left them.

        The state the cache receives (``state_output``) is ``carried["state"]``
        at ``heads`` and the call's own elsewhere; the last token reads the
        state after itself, so its head output becomes that state's answer
        (``read_state``), as with ``set_state_after`` in one run. A kind that
        carries more writes its parts where its next call reads them, and a
        kind whose token reads the state before itself leaves its output.
        Returns the state the next call starts from, [batch, ...] as
        ``state_output``.
        """
        state = self.spliced_state(carried, heads)
        outputs = self.attention_head_outputs
        answered = outputs.clone()
        answered[:, -1] = self.read_state(state, positions=-1).to(outputs)
        self.attention_head_outputs = answered
        self.state_output = state
        return state

    @classmethod
    def continuation_cache(cls, model: Any) -> Any:
        """The cache a run that later runs continue must be given, or ``None`` where the forward returns the one it
        makes. A kind whose model keeps its state on its modules and returns no cache (RecurrentGemma) says what."""
        return None

    def knock_out(self, positions: torch.Tensor) -> None:
        """Take token ``positions[b]`` of each row ``b`` out of what this call's later tokens read.

        A token reaches later ones only through what it writes into the state,
        and it writes with its key (the delta rule's ``beta k v^T`` and key
        removal, Mamba's ``dt B x``): zeroing its key removes the write and
        nothing before it. A kind that writes otherwise (an exponential of the
        key, or with no key) overrides this, marking the tokens with
        :func:`~nnterp.analysis.knockout.knocked_tokens`. Inside a trace, on a
        prompt's call; ``nnterp.analysis.knock_out`` calls it.
        """
        keys = self.attention_keys
        knocked = knocked_tokens(positions, keys, f"{standard_path(self)}.attention_keys")
        self.attention_keys = keys.masked_fill(knocked.view(*knocked.shape, *[1] * (keys.dim() - 2)), 0)

    def state_gradient_inputs(self) -> tuple[torch.Tensor | None, ...]:
        """Inside a trace: what ``state_gradients`` needs from this call, read from its arguments (save each).

        Read it with the call's other values, in forward order: the arguments
        are recorded when the call starts.

        Raises:
            nnterp.Unavailable: the kind declares no gradient of its states.
        """
        raise Unavailable(
            f"{standard_path(self)}: a {type(self).__name__} does not say how its states' gradient runs back through "
            f"its recurrence; attribute its head outputs or its output instead"
        )

    @classmethod
    def state_gradients(
        cls, inputs: tuple[torch.Tensor | None, ...], head_output_gradients: torch.Tensor
    ) -> torch.Tensor:
        """The gradient with respect to the state after each token, [batch, seq, ...] as ``states``, float32.

        ``inputs`` come from ``state_gradient_inputs`` and
        ``head_output_gradients`` is the gradient with respect to
        ``attention_head_outputs`` ([batch, seq, ...] as it is served). The
        state after token ``t`` reaches the metric only through the head
        outputs it is read by at ``t`` and later, with the call's gates fixed,
        so its gradient is the adjoint of the recurrence, run backwards from
        the last token: what ``nnterp.analysis.attribution_patch`` multiplies
        by a patch of the states. A kind that declares
        ``state_gradient_inputs`` declares this.
        """
        raise NotImplementedError(f"{cls.__name__} declares no state_gradients")

    def state_patch_inputs(self) -> tuple[torch.Tensor, ...]:
        """Inside a trace: what ``state_patch_estimates`` needs from one run of this call (save each).

        By default the call's ``state_gradient_inputs`` and its states after
        every token (``state_trajectory``); a kind that estimates a patch
        without forming every state reads less. Read it with the call's other
        values, in forward order.

        Raises:
            nnterp.Unavailable: the kind declares no gradient of its states.
        """
        return (*self.state_gradient_inputs(), self.state_trajectory)

    @classmethod
    def state_patch_estimates(
        cls, clean: tuple[torch.Tensor, ...], corrupt: tuple[torch.Tensor, ...], head_output_gradients: torch.Tensor
    ) -> torch.Tensor:
        """How patching the corrupt run's state after each token into the clean run moves a metric, to first order.

        ``(corrupt S_t - clean S_t) . dM/dS_t`` per token and head, [batch,
        seq, heads], float32: ``clean`` and ``corrupt`` come from
        ``state_patch_inputs`` on the two runs, ``head_output_gradients`` is
        the metric's gradient with respect to the clean run's
        ``attention_head_outputs``; ``corrupt``'s tensors may be written
        over. By default the adjoint
        (``state_gradients``) times the difference of the two trajectories,
        summed over each head's state.
        """
        gradients = cls.state_gradients(clean[:-1], head_output_gradients)
        # the difference goes in place: corrupt's states are the caller's to give up, a state-sized copy spared
        patch = corrupt[-1].float().sub_(clean[-1].float())
        return torch.einsum("...i,...i->...", patch.flatten(3), gradients.flatten(3).to(patch.dtype))

    @classmethod
    def declares_state_gradients(cls) -> bool:
        """Whether the kind says how its states' gradient runs back through its recurrence (``state_gradients``)."""
        return cls.state_gradients.__func__ is not RecurrentMixer.state_gradients.__func__

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
        if self.segmented() or self._token_passed(position):
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
        if self.segmented():
            self.write_across_calls(type(self).states)
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
                    check_layout(type(self).state, self, current, value)
                op.output = piece
            self.passing_call(call)
        self.record_order("states", written=True)
