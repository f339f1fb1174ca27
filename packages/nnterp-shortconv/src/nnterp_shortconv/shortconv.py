"""ShortConv: a gated short convolution's values (LFM2's ``Lfm2ShortConv``), read in its forward and at its conv call."""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from nnsight.intervention.interleaver import Mediator
from torch import Tensor

from nnterp import DerivedEProperty, EProperty, RecurrentMixer, Unavailable, unavailable
from nnterp.analysis.mixing import Heads, TokenMixing
from nnterp.components.call_site import argument, forward_arguments, kernel, needs_kernel_call
from nnterp.components.declaration import KernelCall
from nnterp.components.per_call import current_call, per_call, replace_per_call
from nnterp.components.per_token import ALWAYS
from nnterp.forward_source import Call, ForwardSource
from nnterp.layout_checks import check_layout
from nnterp.layouts import BATCH, CHANNELS, SEQ, ScanMixing, ScanValues
from nnterp.order import OrderError, standard_path
from nnterp.positions import Positions
from nnterp.value_paths import resolve

from .window import conv_readout, conv_windows, window_mixing, written_window_effect

#: The axis of a convolution's window: the cached inputs, the mixer's ``conv_L_cache``.
WINDOW = "conv_window"
ConvState = Float[Tensor, f"{BATCH} {CHANNELS} {WINDOW}"]
ConvStates = Float[Tensor, f"{BATCH} {SEQ} {CHANNELS} {WINDOW}"]
ConvWeights = Float[Tensor, f"{CHANNELS} {WINDOW}"]

#: The forward's split of its input projection into B, C and x: the one place all three exist.
SPLIT = Call("BCx.chunk")
#: The values the forward produces before its conv call, in the order of ``SPLIT``'s output.
GATES = ("attention_keys", "attention_queries", "attention_values")
#: The values served before the conv call: the window the call starts from, at the mixer's input, then the gates.
BEFORE_THE_CALL = ("state_input", *GATES)

NO_STATE_PLACE = (
    "no operation binds the state after each token: the convolution reads a window of its last conv_L_cache "
    "inputs, so the state after token t is a slice of conv_input; read states or state_after(t), and write "
    "set_state_after(t, value)"
)
NO_CACHE = (
    "this call ran without a cache (use_cache=False), or with one recording every past input (speculative "
    "decoding), so no window is kept after it; trace with use_cache=True, or read states[:, -1]"
)
NOT_ON_A_PROMPT = (
    "state_input on {path}: this call starts from an empty cache, with no window to replace; write the window "
    "after a token instead (set_state_after(t, value))"
)


def cached_window(cache: Any, layer: int) -> torch.Tensor | None:
    """The conv state ``cache`` holds for block ``layer`` (the buffer itself), or ``None`` when it holds none yet."""
    if cache is None:
        return None
    held = cache.layers[layer]
    return held.conv_states[0] if held.has_previous_state[0] else None


def recording(cache: Any, layer: int) -> bool:
    """Whether ``cache`` keeps every past input of block ``layer`` (speculative decoding), not a window of them."""
    return cache is not None and bool(getattr(cache.layers[layer], "record_past", False))


class SplitGate(EProperty):
    """A gate read at the forward's split of its projection, where an assignment leaves the other gates readable.

    The first assignment in a call puts copies of B, C and x in place of the
    split's output, with the assigned gate copied in; the forward goes on
    with them, and the call's later reads and writes of any gate are served
    from them (an assignment copied in place), since the split's place has
    then passed.
    """

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        written = obj.written_split()
        if written is None:
            return super().__get__(obj, owner)
        self._check(obj)
        obj.check_order(self.name)
        value = self._define(obj, written[self.select])
        obj.record_order(self.name)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        current = self.__get__(obj)
        check_layout(self, obj, current, value)
        written = obj.written_split()
        if written is None:
            written = tuple(gate.clone() for gate in obj.split())
            Mediator.swap(self._location(obj), written)
            replace_per_call(obj, "split", written)
            replace_per_call(obj, "split written", written)
        with torch.no_grad():
            self._define(obj, written[self.select]).copy_(value)
        obj.record_order(self.name, written=True)


class ShortConv(RecurrentMixer):
    """A gated short convolution (LFM2, LFM2-MoE and LFM3's conv blocks): ``y = C * conv(B * x)``.

    The input projection gives three tensors per token, each ``channels``
    (the model's ``hidden_size``) wide: an input gate ``B``, an output gate
    ``C`` and values ``x``. A depthwise causal convolution of width ``k``
    (``conv_L_cache``) runs over ``B * x``, per channel::

        conv_t = bias + sum_i w[i] * (B * x)_{t - k + 1 + i}
        y_t = C_t * conv_t

    and ``out_proj`` maps ``y`` back to the residual stream. In the vocabulary
    recurrent mixers share, ``B`` writes into the state as a key does
    (``attention_keys``), ``C`` reads it as a query does
    (``attention_queries``), ``x`` is what is written (``attention_values``),
    ``B * x`` the conv's input (``conv_input``), and the conv weights play the
    part of the decays (``decays``): how much of a token is still read ``i``
    tokens later. The state is the window of the last ``k`` conv inputs the
    cache keeps (its oldest entry is read by no later token); the state after
    every token is a slice of ``conv_input``, so ``states``, ``state_after``
    and ``state_trajectory`` are exact copies, whatever kernel runs.

    B, C and x are read at the forward's split of the projection; the rest at
    the conv call: ``causal_conv1d_fn`` on a prompt (its input preceded by the
    cached window when a cache holds one), ``causal_conv1d_update`` on a
    decode step (which rolls the cached window and takes one dot product). In
    transformers 5.25 both sit inside ``causal_conv1d_forward``. The values
    are read at the call, not inside it, so an optimized ``causal_conv1d``
    kernel behind transformers' dispatcher changes nothing and no routing is
    needed.
    """

    PROMPT = KernelCall("causal_conv1d_fn")
    DECODE = KernelCall("causal_conv1d_update", "conv_state")
    PER_TOKEN = ALWAYS
    MIXING_HEADS = CHANNELS
    KIND = "gated short convolution"
    ORDER = (
        ("state_input",),
        GATES,
        ("conv_input",),
        ("state", "states"),
        ("attention_head_outputs", "state_output"),
    )

    # -- sizes ---------------------------------------------------------------------

    @property
    def channels(self) -> int:
        """Width of the convolution: the model's ``hidden_size``, one filter per channel."""
        return self._module.conv.in_channels

    @property
    def conv_window(self) -> int:
        """Inputs a conv state holds: the filter width ``conv_L_cache``."""
        return self._module.conv_kernel_size

    # -- the call ------------------------------------------------------------------

    @classmethod
    def check_forward(cls, module_class: type, layout: Any) -> None:
        """The forward splits its projection into B, C and x, where the gates are read."""
        SPLIT.find(ForwardSource.of(module_class.forward))

    def forward_call(self) -> tuple[int, Any]:
        """This call's length and cache, and a copy of the window the cache held as the call started, once per call."""

        def read() -> tuple[int, Any]:
            hidden, cache = forward_arguments(self.inputs)
            window = cached_window(cache, self._module.layer_idx)
            replace_per_call(self, "entering window", None if window is None else window.clone())
            return hidden.shape[1], cache

        return per_call(self, "forward call", read)

    def kernel_call(self) -> KernelCall:
        """The conv call that fires: the one-token update over a cached window, the prompt's convolution otherwise.

        The forward's own test: one token, a cached window, and a cache that
        does not record its past.
        """
        cls = type(self)

        def choose() -> KernelCall:
            seq, cache = self.forward_call()
            layer = self._module.layer_idx
            decoding = seq == 1 and self.entering_state() is not None and not recording(cache, layer)
            return cls.DECODE if decoding else cls.PROMPT

        return per_call(self, "kernel", choose)

    def entering_state(self) -> torch.Tensor | None:
        """The window the cache held as this call started (a copy), or ``None`` on a call from an empty cache."""
        self.forward_call()
        return self._peek("entering window")

    def call_length(self) -> int:
        """This call's tokens: the mixer's input length (a prompt's conv input may be preceded by a cached window)."""
        return self.forward_call()[0]

    def _seq(self, args: tuple, kwargs: dict) -> int:
        return self.call_length()

    def call_arguments(self) -> tuple[tuple, dict]:
        """The conv call's ``(args, kwargs)``, read once per call, after the mixer's input and the split's B, C, x."""
        self.kernel_call()
        self.split()
        return super().call_arguments()

    def split(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """B, C and x as the forward split them, channel-first [batch, channels, seq], read once per call."""
        return per_call(self, "split", lambda: resolve(self, self._split_key())[0].output)

    def written_split(self) -> tuple[torch.Tensor, ...] | None:
        """The copies of B, C and x a gate assignment put in place of the split's output in this call, if any."""
        return self._peek("split written")

    def cache_window(self) -> torch.Tensor | None:
        """The cache's conv state buffer for this block, as the forward leaves it, or ``None`` without a cache."""
        _, cache = self.forward_call()
        if cache is None or recording(cache, self._module.layer_idx):
            return None
        return cache.layers[self._module.layer_idx].conv_states[0]

    def conv_inputs(self) -> torch.Tensor:
        """``B * x`` of this call's tokens as the conv call received it, [batch, channels, seq]."""
        return self.argument("hidden_states")[..., -self.call_length() :]

    def weights(self) -> torch.Tensor:
        """The depthwise filters, [channels, conv_window]."""
        return self._module.conv.weight[:, 0]

    # -- order: the gates come before the conv call ---------------------------------------

    def check_order(self, name: str) -> None:
        """``CallOrder.check_order``, but the values before the conv call do not wait for its arguments, and the
        filters, a parameter, have no place in the call."""
        if name == "decays":
            return
        if name not in BEFORE_THE_CALL:
            super().check_order(name)
            return
        where = f"{name} on {standard_path(self)}"
        if self._returned():
            raise OrderError(f"{where} was asked for after this call of the mixer returned; {self.order_hint(name)}")
        furthest = self._peek("furthest")
        if furthest is None and self._between_calls():
            furthest = self._peek("furthest", current_call(self) - 1)
        later = furthest.last if furthest is not None and furthest.stage > self._stage(name) else None
        if later is None and self._peek("arguments") is not None:
            later = "a value read at the conv call"
        if later is None and name == "state_input":
            later = self._peek("gates") or ("the gates" if self._peek("split") is not None else None)
        if later is not None:
            raise OrderError(
                f"{where} was asked for after {later}, which this call's forward produces later; "
                f"{self.order_hint(name)}"
            )
        self.kernel_call()

    def record_order(self, name: str, written: bool = False) -> None:
        """``CallOrder.record_order``; a gate is noted apart, so that values computed from the call's arguments,
        which are read after the gates, can still follow it."""
        if name in GATES:
            replace_per_call(self, "gates", name)
            return
        super().record_order(name, written)

    # -- the gates and values -------------------------------------------------------------

    def _split_key(self) -> str:
        return f"source.{SPLIT.find(ForwardSource.of(type(self._module).forward)).label}.output"

    @SplitGate(_split_key, unavailable=needs_kernel_call, select=0)
    def attention_keys(self, value: Any) -> ScanValues:
        """B, the input gate, [batch, seq, channels]: how much of each channel's x a token writes into the window.

        A view of the projection's split. Assign it (the other gates stay
        readable after), or edit in place under ``torch.no_grad()`` (torch
        refuses in-place edits of a split's view while autograd is on).
        """
        return value.transpose(1, 2)

    @SplitGate(_split_key, unavailable=needs_kernel_call, select=1)
    def attention_queries(self, value: Any) -> ScanValues:
        """C, the output gate, [batch, seq, channels]: what each token multiplies its conv output by.

        Assign, or edit in place under ``torch.no_grad()``.
        """
        return value.transpose(1, 2)

    @SplitGate(_split_key, unavailable=needs_kernel_call, select=2)
    def attention_values(self, value: Any) -> ScanValues:
        """x, the values, [batch, seq, channels]: what each token offers the convolution before the B gate.

        Assign, or edit in place under ``torch.no_grad()``.
        """
        return value.transpose(1, 2)

    @EProperty(kernel("inputs"), unavailable=needs_kernel_call, select=argument("hidden_states"))
    def conv_input(self, value: Any) -> ScanValues:
        """B * x, the convolution's input, [batch, seq, channels]: this call's tokens of the conv call's argument.

        On a prompt over a cache the argument starts with the cached window
        (or zero padding); those columns are not this call's and are left
        out. Assign it: the convolution, and the window the cache keeps, take
        the assigned inputs.
        """
        return value[..., -self.call_length() :].transpose(1, 2)

    @conv_input.postprocess
    def conv_input(self, value: torch.Tensor) -> torch.Tensor:
        full = self.argument("hidden_states").clone()
        full[..., -self.call_length() :] = value.transpose(1, 2)
        buffer = self.cache_window()
        if buffer is not None and not self.decoding():
            # a prompt's cache took its window before the conv call: it follows the assignment
            with torch.no_grad():
                buffer.copy_(full[..., -buffer.shape[-1] :])
        return full

    def _decays(self) -> ConvWeights:
        """The conv filters, [channels, conv_window]: the weight a token's input gets ``conv_window - 1 - i`` tokens later at ``i``.

        The decays' counterpart: where a recurrence forgets a token
        geometrically, the convolution reads it with ``w[k-1]`` at its own
        position, ``w[k-2]`` one token later, ..., and not at all after
        ``k - 1``. A parameter of the module; read-only here.
        """
        return self.weights().detach()

    decays = DerivedEProperty(_decays, unavailable=needs_kernel_call)

    @EProperty("inputs", unavailable=needs_kernel_call, select="hidden_states")
    def state_input(self, value: Any) -> ConvState:
        """The window a call starts from, [batch, channels, conv_window]: a copy of the cache's; ``None`` from an empty cache.

        Read at the mixer's input, before the forward hands the cache's
        buffer to the conv. Assigning it writes that buffer, which the call
        then convolves (a decode step's update, or a prompt continuing a
        cache); a call from an empty cache has no window to replace.
        """
        return self.entering_state()

    @state_input.postprocess
    def state_input(self, value: torch.Tensor) -> torch.Tensor:
        buffer = cached_window(self.forward_call()[1], self._module.layer_idx)
        if buffer is None:
            raise ValueError(NOT_ON_A_PROMPT.format(path=standard_path(self)))
        with torch.no_grad():
            buffer.copy_(value)
        replace_per_call(self, "entering window", value.detach().clone())
        return forward_arguments(self.inputs)[0]

    @EProperty(kernel("output"), unavailable=needs_kernel_call)
    def attention_head_outputs(self, value: Any) -> ScanValues:
        """The conv output before the C gate, [batch, seq, channels]: ``conv_t`` per channel.

        The conv call's output for this call's tokens. Assign, or edit in
        place: ``y = C * conv`` follows.
        """
        return value[..., -self.call_length() :].transpose(1, 2)

    @attention_head_outputs.postprocess
    def attention_head_outputs(self, value: torch.Tensor) -> torch.Tensor:
        # a prompt over a cache convolves the cached window too; the forward drops those columns, so zeros do
        length = self.argument("hidden_states").shape[-1]
        value = value.transpose(1, 2)
        return torch.cat([value.new_zeros((*value.shape[:-1], length - value.shape[-1])), value], dim=-1)

    def _state_output_key(self) -> str:
        if self.cache_window() is None:
            raise Unavailable(f"state_output on {standard_path(self)}: {NO_CACHE}")
        return kernel("output")(self)

    @EProperty(_state_output_key, unavailable=needs_kernel_call)
    def state_output(self, value: Any) -> ConvState:
        """The window after the call's last token, [batch, channels, conv_window]: a copy of the cache's conv state.

        Read once the conv call has returned, when the cache holds it.
        Assigning it, or editing it in place, changes what the next call
        starts from, not this call's output.
        """
        buffer = self.cache_window()
        return self.serve_state(buffer, _same, buffer=buffer)

    @state_output.postprocess
    def state_output(self, value: torch.Tensor) -> Any:
        with torch.no_grad():
            self.cache_window().copy_(value)
        return self._call_operation().output

    @state_output.transform
    def state_output(self, view: torch.Tensor, element: Any) -> Any:
        return self.write_back_state(view, element)

    # -- the state after every token ------------------------------------------------------

    state = unavailable(NO_STATE_PLACE)

    def _states(self) -> ConvStates:
        """The window after every token of this call, [batch, seq, channels, conv_window]: slices of conv_input.

        Exact copies of the conv's inputs (zeros before the first token of a
        call from an empty cache). After ``set_state_after`` in the same call
        it raises: the write is not among the conv's inputs.
        """
        return self._recomputed("states", None)

    states = DerivedEProperty(_states, unavailable=needs_kernel_call)

    def _state_trajectory(self) -> ConvStates:
        """The window after every token of this call, [batch, seq, channels, conv_window], from the conv call's arguments."""
        return self.trajectory()

    state_trajectory = DerivedEProperty(_state_trajectory, unavailable=needs_kernel_call)

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> ConvStates:
        """The windows after ``positions`` of this call (``conv_windows``), in ``dtype`` or the conv input's."""
        windows = conv_windows(self.conv_inputs(), self.entering_state(), self.conv_window, positions)
        return windows if dtype is None else windows.to(dtype)

    def state_after(self, t: int) -> ConvState:
        """The window after token ``t`` of this call, [batch, channels, conv_window]: a slice of the conv's inputs."""
        return self._recomputed(f"state_after({t})", self._position("state_after", t))

    def set_state_after(self, t: int, value: torch.Tensor) -> None:
        """Make the window after token ``t`` be ``value``: the next ``conv_window - 1`` tokens read it, no others.

        The convolution is linear in its window, so the write is the change
        it makes to the conv outputs of tokens ``t+1 .. t+k-1`` of this call
        (added to the conv call's output), and where the window reaches past
        the call's last token, to the window the cache keeps for the next
        call. Write it before reading ``attention_head_outputs`` or
        ``state_output`` of the same call, and read ``states`` before it.
        """
        position = self._position("set_state_after", t)
        furthest = self._peek("furthest")
        if self._returned() or (furthest is not None and furthest.stage > self._stage("states")):
            after = f" after {furthest.last}" if furthest is not None else ""
            raise OrderError(
                f"set_state_after({t}) on {standard_path(self)}: the conv call has already run{after}, so the write "
                f"could not reach the tokens after {t}; write the window before reading attention_head_outputs, "
                f"state_output or any later value of this call ({self.order_hint('set_state_after')})"
            )
        current = self.trajectory(positions=position)
        if tuple(value.shape) != tuple(current.shape):
            raise ValueError(
                f"set_state_after({t}) on {standard_path(self)}: the window is [batch, channels, conv_window] = "
                f"{list(current.shape)}, got {list(value.shape)}"
            )
        seq = self.call_length()
        operation = self._call_operation()
        output = operation.output
        change = written_window_effect(self.weights(), (value - current).to(output.dtype), position, seq)
        operation.output = output + torch.cat(
            [change.new_zeros((*change.shape[:-1], output.shape[-1] - seq)), change], dim=-1
        )
        buffer = self.cache_window()
        if buffer is not None:
            k = self.conv_window
            # the cache's window holds positions seq-k .. seq-1; the written one t-k+1 .. t
            for p in range(max(seq - k, position - k + 1), position + 1):
                buffer[..., p - (seq - k)] = value[..., p - (position - k + 1)].to(buffer.dtype)
        self.record_order("states", written=True)

    # -- token mixing ----------------------------------------------------------------------

    def token_mixing(self, positions: Positions = None, heads: Heads = None) -> ScanMixing:
        """The conv as a matrix per channel, [batch, channels, rows, seq]: how each conv output mixes the values x.

        ``M[b, c, t, j] = w[c, k - 1 - (t - j)] * B[b, j, c]`` for
        ``0 <= t - j < k``: a banded Toeplitz matrix of the filter per channel,
        each column scaled by its token's input gate, so
        ``mixed(M, attention_values) + mixing_offset() == attention_head_outputs``;
        the offset holds the bias and what the cached window the call started
        from contributes. Multiply a row by ``C_t`` for the gated ``y_t``.
        """
        return super().token_mixing(positions, heads)

    def mixing_from_arguments(self, rows: torch.Tensor, heads: torch.Tensor) -> TokenMixing:
        """The conv's token mixing at ``rows`` and the channels ``heads`` (``window_mixing``), float32."""
        gate = self.split()[0]
        return window_mixing(
            self.conv_inputs(), gate, self.entering_state(), self.weights(), self._module.conv.bias, rows, heads
        )

    def readout_from_arguments(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The conv output each row would give reading ``state`` as its window (``conv_readout``)."""
        return conv_readout(state, self.weights(), self._module.conv.bias, len(rows))


def _same(state: torch.Tensor) -> torch.Tensor:
    """A conv state's standard layout is the cache's."""
    return state
