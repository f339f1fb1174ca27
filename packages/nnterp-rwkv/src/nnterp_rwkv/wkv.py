"""Wkv: an RWKV-4 time-mixing block's values, read at the ``rwkv_linear_attention`` call its forward makes."""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from nnterp import DerivedEProperty, EProperty, RecurrentMixer, Unavailable, needs_torch_kernels, unavailable
from nnterp.analysis.knockout import knocked_tokens
from nnterp.analysis.mixing import Heads, TokenMixing
from nnterp.components.call_order import CALL_ARGUMENTS
from nnterp.components.call_site import SERVED_FROM, argument, bound_kernel, kernel
from nnterp.components.declaration import (
    ENTERING_STATE,
    KernelCall,
    declaration_mismatch,
    kernel_function,
    modeling_module,
)
from nnterp.components.per_call import per_call, pinned, replace_per_call
from nnterp.components.per_token import TRACED_BEFORE_ROUTING, TokenLoop
from nnterp.forward_source import Binding, Call, ForwardSource, NotInForward, Place, callee
from nnterp.layouts import BATCH, CHANNELS, HIDDEN, KEY, QUERY, SEQ
from nnterp.order import OrderError, standard_path
from nnterp.positions import Positions

from .mixing import wkv_mixing, wkv_readout
from .trajectory import wkv_states

PARTS = "parts"
#: A per-token, per-channel tensor: keys, values, receptance, the WKV output.
WkvSequence = Float[Tensor, f"{BATCH} {SEQ} {CHANNELS}"]
#: A per-channel parameter: the bonus, the log decay.
WkvChannels = Float[Tensor, f"{CHANNELS}"]
#: The kernel's state: per channel (numerator, denominator, max exponent), stabilized.
WkvState = Float[Tensor, f"{BATCH} {CHANNELS} {PARTS}"]
WkvStates = Float[Tensor, f"{BATCH} {SEQ} {CHANNELS} {PARTS}"]
#: The token shift's state: the previous token's input to the block's time mixing.
WkvShift = Float[Tensor, f"{BATCH} {HIDDEN}"]
WkvMixing = Float[Tensor, f"{BATCH} {CHANNELS} {QUERY} {KEY}"]

#: The key a knocked-out token gets: the cache's empty max exponent, so exp(k) is exactly 0 beside any real key.
KNOCKED_KEY = -1e30

#: Values read before the kernel call: at the mixer's input, or the token shift's receptance.
BEFORE_THE_CALL = ("shift_state_input", "attention_gates")

#: The token loop's bindings of the three parts, in the order it binds them after each token.
LOOP_PARTS = ("num_state", "den_state", "max_state")

NO_STATE = (
    "this call ran without a cache (use_cache=False) and was given no state, so rwkv_linear_attention returns no "
    "final state; trace with use_cache=True (the default), or read states[:, -1]"
)
NO_ENTERING_STATE = (
    "state_input on {path}: this call runs without a cache (use_cache=False), so its kernel starts from its own empty "
    "state and takes none to replace; trace with use_cache=True, or write the state after a token "
    "(set_state_after(t, value))"
)
NO_QUERIES = (
    "an RWKV-4 time mixing reads its state with no query: each channel's output is its numerator over its "
    "denominator, gated by the receptance (attention_gates)"
)
THREE_BINDINGS = (
    "the WKV token loop binds the state after a token as three variables (num_state, den_state, max_state), so it is "
    "not one place tracer.iter can step to; read states or state_after(t), and write set_state_after(t, value)"
)


class WkvLoop(TokenLoop):
    """Per-token states from ``rwkv_linear_attention_cpu``, the token loop ``rwkv_linear_attention`` calls on a CPU.

    On a GPU with the compiled kernel loaded, ``rwkv_linear_attention`` runs it
    for a prompt instead; routing binds the forward's name to the loop.
    """

    hint = (
        "the state after each token is bound inside rwkv_linear_attention_cpu, one call below the forward's "
        "rwkv_linear_attention (which runs a compiled CUDA kernel instead where one is loaded); call "
        "nnterp.route_kernels(model.family, 'torch') before the first trace that touches this mixer, to bind "
        "rwkv_linear_attention to the token loop"
    )

    def routed_function(self, mixer: type["Wkv"], call: KernelCall, pure: Any) -> Any:
        return pure[call.function].__globals__[mixer.LOOP.function]

    def body_of(self, mixer: type["Wkv"], call: KernelCall) -> KernelCall:
        return mixer.LOOP

    def reason(self, envoy: "Wkv") -> str | None:
        reason = needs_torch_kernels(envoy)
        if reason is not None:
            return reason
        layout = envoy.forward_layout()
        loop = vars(modeling_module(type(envoy._module)))[type(envoy).LOOP.function]
        if callee(bound_kernel(envoy._module, layout.prompt)).function is loop:
            return None
        return TRACED_BEFORE_ROUTING if kernel_function(type(envoy._module), layout.prompt) is loop else self.hint


def _stacked(parts: Any) -> Tensor:
    """The kernel's (num, den, max) as one ``[batch, channels, 3]`` tensor."""
    return torch.stack(tuple(parts), -1)


class Wkv(RecurrentMixer):
    """An RWKV-4 time-mixing block (``RwkvSelfAttention``): the WKV linear attention.

    Per channel c, with ``w = exp(time_decay)`` (the decay per token) and
    ``u = time_first`` (the bonus of a token's own key), token t's output is::

        wkv_t = (sum_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (sum_{i<t} e^{-(t-1-i) w + k_i} + e^{u + k_t})

    gated by the receptance, ``output(sigmoid(r_t) * wkv_t)``, into
    ``attention_output``. Keys, values and receptance come from a token shift:
    each is a learned mix of the token's input and the previous token's.

    The values are read at the forward's call
    ``rwkv_linear_attention(time_decay, time_first, key, value, state=, return_state=)``,
    which runs the pure-torch token loop ``rwkv_linear_attention_cpu`` on a CPU
    and for one token (a compiled CUDA kernel for a prompt on a GPU where one
    is loaded). One function serves prompts and decode steps alike, so
    ``PROMPT`` and ``DECODE`` name the same call; a call decodes where the
    forward's own test says so: one token over a cached state, whose token
    shift then reads the previous token from the cache.

    The state is three numbers per channel, the kernel's stabilized form
    (``[batch, channels, 3]``, last axis ``parts``): 0 the numerator, 1 the
    denominator, 2 the max exponent; the real sums are ``num * exp(max)`` and
    ``den * exp(max)``. It is slice 2, 3, 4 of the model's ``state`` list at
    this layer. The token shift's state is slice 1, the previous token's
    ``ln1`` output, served apart as ``shift_state_input`` (slice 0 is the
    feed-forward's own token shift, not this mixer's).

    Routed (``nnterp.route_kernels(model.family, "torch")``), the forward's
    name is bound to the token loop, which binds the three parts after every
    token: ``states``, ``state_after`` and ``set_state_after`` reach every
    position; ``state``, one place per token, does not exist, since a token's
    state is three bindings. ``state_trajectory`` computes the same states
    from the call's arguments, routed or not. With the keys fixed the output
    is exactly linear in the values, so ``token_mixing`` is exact.
    """

    PROMPT = KernelCall("rwkv_linear_attention", "state", Binding("max_state", loop=True))
    DECODE = KernelCall("rwkv_linear_attention", "state", Binding("max_state", loop=True))
    #: The token loop routing binds the forward's name to, where the state after each token is bound.
    LOOP = KernelCall("rwkv_linear_attention_cpu", "state", Binding("max_state", loop=True))
    PER_TOKEN = WkvLoop()
    #: token_mixing's heads: each channel runs its own recurrence over its own values
    MIXING_HEADS = CHANNELS
    KIND = "RWKV-4 WKV linear attention"
    #: the model takes and returns what a run leaves for the next as its ``state`` list, not a cache
    CARRIER = "state"
    # the receptance is computed before the kernel call; the kernel returns its output and final state together
    ORDER = (
        ("attention_gates",),
        (*CALL_ARGUMENTS, "bonus"),
        ("state", "states"),
        ("attention_head_outputs", "state_output"),
    )

    # -- sizes ---------------------------------------------------------------------

    @property
    def channels(self) -> int:
        """Width of the WKV: the module's ``attention_hidden_size``."""
        return self._module.attention_hidden_size

    @property
    def parts(self) -> int:
        """The state's numbers per channel: numerator, denominator, max exponent."""
        return 3

    # -- the declaration ---------------------------------------------------------------

    @classmethod
    def check_forward(cls, module_class: type, layout: Any) -> None:
        """The token loop routing binds exists and binds the three parts of the state after each token."""
        loop = vars(modeling_module(module_class)).get(cls.LOOP.function)
        if loop is None:
            raise NotInForward(f"a module function {cls.LOOP.function}, the token loop; the modeling module has none")
        body = ForwardSource.of(loop)
        for name in LOOP_PARTS:
            Binding(name, loop=True).find(body)

    def forward_call(self) -> tuple[int, Any]:
        """This call's length and the model's ``state`` list it was given (``None`` without a cache)."""

        def read() -> tuple[int, Any]:
            args, kwargs = self.inputs
            hidden = args[0] if args else kwargs["hidden"]
            state = kwargs.get("state", args[1] if len(args) > 1 else None)
            # the token shift's slice of the state, copied now: the forward overwrites it before the kernel call
            shift = None if state is None else state[1][:, :, self._module.layer_id].clone()
            replace_per_call(self, "shift", shift)
            return hidden.shape[1], state

        return per_call(self, "forward call", read)

    def kernel_call(self) -> KernelCall:
        """``DECODE`` where the forward's token shift reads the cache (one token over a state), else ``PROMPT``."""
        cls = type(self)

        def choose() -> KernelCall:
            seq, state = self.forward_call()
            return cls.DECODE if seq == 1 and state is not None else cls.PROMPT

        return per_call(self, "kernel", choose)

    def check_order(self, name: str) -> None:
        """``CallOrder.check_order``, but the receptance, made before the kernel call, does not park the worker there.

        Every other value records the call's arguments as it is checked; the
        receptance's place comes first, and the forward's own order check
        (nnsight's) refuses it once the worker has passed it. Which kernel call
        fires is decided first, from the mixer's input, which the receptance is past.
        """
        if name not in BEFORE_THE_CALL:
            super().check_order(name)
        elif not self._returned():
            self.kernel_call()

    def _prompt_length(self, args: tuple, kwargs: dict) -> int:
        return self.argument("key", (args, kwargs)).shape[1]

    def _copied_state(self, arguments: tuple[tuple, dict]) -> Tensor | None:
        state = self.argument(ENTERING_STATE, arguments)
        return None if state is None else _stacked(state).clone()

    # -- the values --------------------------------------------------------------------

    def _shift_state_input(self) -> WkvShift:
        """The token shift's entering state, [batch, hidden_size]: the previous token's ``ln1`` output; derived, read-only.

        Slice 1 of the model's ``state`` list at this layer, as the call
        received it (a copy: the forward overwrites it with this call's last
        token): on a decode step, or a prompt continuing a cache, what the
        call's first token mixes its keys, values and receptance with; zeros
        on a fresh prompt with a cache, ``None`` without one (the shift then
        pads with zeros). Not part of the WKV state: ``state_input`` is.
        """
        self.forward_call()
        return per_call(self, "shift", lambda: None)

    shift_state_input = DerivedEProperty(_shift_state_input)

    def _no_queries(self) -> str:
        return declaration_mismatch(self) or NO_QUERIES

    attention_queries = EProperty(unavailable=_no_queries, description=NO_QUERIES)

    @EProperty(Place(Call("self.extract_key_value")), select=0)
    def attention_gates(self, value: Any) -> WkvSequence:
        """The receptance ``sigmoid(r)``, [batch, seq, channels]: the gate on the WKV output before ``output``.

        Computed by the token shift before the kernel call. Assign, or edit in place.
        """
        return value

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels, select=argument("key"))
    def attention_keys(self, value: Any) -> WkvSequence:
        """k, [batch, seq, channels]: ``exp(k)`` is how much each token writes into each channel's sums.

        After the token shift and the key projection. Assign, or edit in place.
        """
        return value

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels, select=argument("value"))
    def attention_values(self, value: Any) -> WkvSequence:
        """v, [batch, seq, channels]: what each token writes. Assign, or edit in place."""
        return value

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels, select=argument("time_first"))
    def bonus(self, value: Any) -> WkvChannels:
        """u (``time_first``), [channels]: the extra log weight a token's own key gets in its own output.

        The module's parameter as the kernel receives it; assigning replaces it
        for this call only.
        """
        return value

    def _decays(self) -> WkvChannels:
        """The log decay per token, ``-exp(time_decay)``, [channels], as the kernel computes it; derived, read-only."""
        return -torch.exp(self.argument("time_decay"))

    decays = DerivedEProperty(_decays, unavailable=needs_torch_kernels)

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels, select=argument(ENTERING_STATE))
    def state_input(self, value: Any) -> WkvState:
        """The state the call starts from, [batch, channels, 3] (num, den, max): a copy; ``None`` without a cache.

        With a cache a prompt starts from the model's empty state (zeros, a
        max of -1e30) and a decode step from the state the last call left. A
        copy, because the forward writes the call's final state into the same
        buffers. Assigning writes into the model's state, which the kernel then
        starts from.
        """
        return None if value is None else _stacked(value).clone()

    @state_input.postprocess
    def state_input(self, value: Tensor) -> Any:
        cached = self.argument(ENTERING_STATE)
        if cached is None:
            raise ValueError(NO_ENTERING_STATE.format(path=standard_path(self)))
        with torch.no_grad():
            for part, new in zip(cached, value.unbind(-1), strict=True):
                part.copy_(new)
        return cached

    # select=0: the kernel returns (output, state)
    @EProperty(kernel("output"), unavailable=needs_torch_kernels, select=0)
    def attention_head_outputs(self, value: Any) -> WkvSequence:
        """The WKV output ``rwkv``, [batch, seq, channels], before the receptance gate and ``output``.

        Assign, or edit in place.
        """
        return value

    def _state_output_key(self) -> str:
        if self.argument(ENTERING_STATE) is None and not self.argument("return_state"):
            raise Unavailable(f"state_output on {standard_path(self)}: {NO_STATE}")
        return kernel("output")(self)

    @EProperty(_state_output_key, unavailable=needs_torch_kernels, select=1)
    def state_output(self, value: Any) -> WkvState:
        """The state after the call's last token, [batch, channels, 3] (num, den, max), as the model's cache receives it.

        A copy stacked from the kernel's three tensors. Assigning it, or
        editing it in place, changes what the next call starts from, not this
        call's output.
        """
        served = _stacked(value)
        setattr(served, SERVED_FROM, (None, _stacked))
        return served

    @state_output.postprocess
    def state_output(self, value: Tensor) -> Any:
        return list(value.unbind(-1))

    @state_output.transform
    def state_output(self, view: Tensor, element: Any) -> Any:
        return list(view.unbind(-1))

    # -- the state after every token ---------------------------------------------------------

    state = unavailable(THREE_BINDINGS)
    states = RecurrentMixer.states.laid_out(WkvStates)
    state_trajectory = RecurrentMixer.state_trajectory.laid_out(WkvStates)

    def _part_ops(self) -> tuple[tuple[Any, ...], int, int]:
        """The token loop's (num, den, max) operations, the occurrence of this call's first token, and its length."""
        op, first, seq = self._token_op()

        def locate() -> tuple[Any, ...]:
            body, source = self._body_operation(), self.body_source()
            return tuple(getattr(body.source, Binding(name, loop=True).find(source).label) for name in LOOP_PARTS)

        return per_call(self, "parts", locate), first, seq

    def per_token_states(self) -> WkvStates:
        """Every token's (num, den, max) as the token loop binds them, [batch, seq, channels, 3]."""
        ops, first, seq = self._part_ops()
        rows = []
        for t in range(seq):
            with pinned(first + t):
                rows.append(_stacked(op.output for op in ops))
        return torch.stack(rows, 1)

    def state_after(self, t: int) -> WkvState:
        """The state after token ``t`` of this call, [batch, channels, 3].

        Read before the token loop reaches ``t``, the loop's own; after, computed
        from the call's arguments (``trajectory(positions=t)``).
        """
        position = self._position("state_after", t)
        if self._token_passed(position):
            return self._recomputed(f"state_after({t})", position)
        ops, first, _ = self._part_ops()
        with pinned(first + position):
            state = _stacked(op.output for op in ops)
        self.record_order("states")
        return state

    def set_state_after(self, t: int, value: Tensor) -> None:
        """Assign the state after token ``t`` ([batch, channels, 3]): the tokens after it continue from ``value``."""
        position = self._position("set_state_after", t)
        if self._token_passed(position):
            raise OrderError(
                f"set_state_after({t}) on {standard_path(self)}: the token loop has already passed token {t}, so "
                f"the write could not reach the tokens after it; write the state before reading states or any later "
                f"position or value of this call ({self.order_hint('set_state_after')})"
            )
        # checked against the layout, not the loop's tensors: reading max_state would pass num_state's place
        expected = (self.channels, self.parts)
        if not isinstance(value, Tensor) or value.dim() != 3 or tuple(value.shape[1:]) != expected:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(
                f"set_state_after({t}) on {standard_path(self)}: expected a floating point tensor of shape "
                f"(*, {expected[0]}, {expected[1]}) [batch, channels, parts] (num, den, max), got {got}; nothing was "
                f"written"
            )
        ops, first, _ = self._part_ops()
        with pinned(first + position):
            for op, part in zip(ops, value.unbind(-1), strict=True):
                op.output = part.float()
        self.record_order("states", written=True)

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> WkvStates:
        """The kernel's states after ``positions`` of this call (``wkv_states``); float32 unless ``dtype`` says."""
        return wkv_states(
            self.argument("time_decay"),
            self.argument("key"),
            self.argument("value"),
            self.entering_state(),
            positions=positions,
            dtype=dtype or torch.float32,
        )

    # -- state patching ------------------------------------------------------------------------

    def carried(self) -> dict[str, Tensor]:
        """What an RWKV block carries past the call's last token: the WKV state and its two token shifts' inputs.

        ``"state"`` is the WKV state after the last token, [batch, channels, 3]
        (``trajectory(positions=-1)``); ``"time_shift"`` the last token's
        ``ln1`` output, [batch, hidden_size], which the next token's keys,
        values and receptance mix with (slice 1 of the model's ``state``
        list); ``"channel_shift"`` its ``ln2`` output, which the next token's
        channel mixing mixes with (slice 0). Save each.
        """
        block = self.parent
        time_shift = block.attention_norm_output[:, -1]
        state = self.trajectory(positions=-1)
        return {"time_shift": time_shift, "state": state, "channel_shift": block.mlp_norm_output[:, -1]}

    def carry(self, carried: dict[str, Tensor], heads: Any) -> Tensor:
        """The next call continues from ``carried`` (``carried()``'s parts): the WKV state at ``heads`` (channels),
        the token shifts whole.

        Token t's own output reads the state after t - 1 (and its own key and
        value), so it stays as it is; the parts reach the tokens after it
        through the model's ``state`` list, written after the block's own
        writes of this call's last token.
        """
        state = self.spliced_state(carried, heads)
        self.state_output = state
        _, kept = self.forward_call()
        layer = self._module.layer_id
        # the time mixing wrote its shift before the kernel call; the channel mixing writes its own as it returns
        kept[1][:, :, layer] = carried["time_shift"].to(kept[1])
        self.parent.mlp.output
        kept[0][:, :, layer] = carried["channel_shift"].to(kept[0])
        return state

    def knock_out(self, positions: Tensor) -> None:
        """Take token ``positions[b]`` of each row ``b`` out of what this call's tokens read.

        A zero key still writes ``exp(0) v``, so the knocked keys are set to
        ``KNOCKED_KEY`` instead: ``exp(k)`` is then exactly 0 next to any real
        key, in the state's sums and in the token's own bonus term, so the
        knocked token's output reads only the tokens before it. A prompt's
        first token knocked out, with nothing before it, still outputs its
        own value (the stabilizer's max is its key then), and writes a term
        every later real key outweighs to exactly 0.
        """
        keys = self.attention_keys
        knocked = knocked_tokens(positions, keys, f"{standard_path(self)}.attention_keys")
        self.attention_keys = keys.masked_fill(knocked[..., None], KNOCKED_KEY)

    # -- token mixing ----------------------------------------------------------------------

    def token_mixing(self, positions: Positions = None, heads: Heads = None) -> WkvMixing:
        """``RecurrentMixer.token_mixing`` per channel: [batch, channels, rows, seq], exact.

        The WKV output is a ratio whose denominator depends on the keys only,
        so with the keys fixed it is linear in the values:
        ``mixed(token_mixing(), attention_values) + mixing_offset()`` is
        ``attention_head_outputs`` to float rounding (``wkv_mixing``). The
        receptance gate stays outside it.
        """
        return super().token_mixing(positions, heads)

    def mixing_from_arguments(self, rows: Tensor, heads: Tensor) -> TokenMixing:
        """The WKV token mixing at ``rows`` and the channels ``heads``; the offset reads the entering state."""
        return wkv_mixing(
            self.argument("time_decay"),
            self.argument("time_first"),
            self.argument("key"),
            self.entering_state(),
            rows,
            heads,
        )

    def read_state(self, state: Tensor, positions: Positions = None) -> Tensor:
        """What this call's head outputs at ``positions`` would be, each token entering with ``state``, [batch, rows, channels].

        RWKV's output at t reads the state after the token before it (and its own
        value at the bonus weight), so ``read_state(state_after(t - 1), t)`` is the
        head output at ``t``, and ``read_state(state_input, 0)`` at the call's
        first token. float32.
        """
        return super().read_state(state, positions)

    def readout_from_arguments(self, state: Tensor, rows: Tensor) -> Tensor:
        """The WKV outputs at ``rows``, each token entering with ``state`` (``wkv_readout``)."""
        return wkv_readout(self.argument("time_first"), self.argument("key"), self.argument("value"), state, rows)
