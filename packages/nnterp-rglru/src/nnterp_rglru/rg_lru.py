"""RgLru: a Griffin / RecurrentGemma recurrent block's values, read at the RG-LRU's scan call and around it."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from transformers import DynamicCache

from nnterp import DerivedEProperty, EProperty, RecurrentMixer, Unavailable
from nnterp.analysis.knockout import knocked_tokens
from nnterp.analysis.mixing import Heads, TokenMixing
from nnterp.components.call_order import CALL_ARGUMENTS
from nnterp.components.call_site import argument, kernel, needs_kernel_call
from nnterp.components.declaration import ENTERING_STATE, KernelCall, kernel_function
from nnterp.components.per_call import current_call, per_call
from nnterp.components.per_token import ALWAYS
from nnterp.forward_source import Binding, ForwardSource, Place
from nnterp.layouts import BATCH, CHANNELS, SEQ, ScanMixing, ScanValues
from nnterp.order import OrderError, standard_path
from nnterp.positions import Positions
from nnterp.value_paths import BoundArgument

from .scan import rglru_mixing, rglru_readout, rglru_states

LruState = Float[Tensor, f"{BATCH} {CHANNELS}"]
LruStates = Float[Tensor, f"{BATCH} {SEQ} {CHANNELS}"]
ConvState = Float[Tensor, f"{BATCH} {CHANNELS} conv_window"]

#: The values the recurrent block and the RG-LRU produce before the scan call, in the forward's order.
BEFORE_THE_CALL = ("output_gates", "conv_output", "input_gates")

NO_CACHE = (
    "this call ran without a cache (use_cache=False): the RG-LRU keeps no state on the module; trace with "
    "use_cache=True, or read states[:, -1]"
)
DECODE_STATE = (
    "{what} on {path}: a one-token call of the RG-LRU's scan takes its branch without a token loop, so there is no "
    "state after the token to write beside state_output; write state_output (or state_input) instead"
)


def _parent_place(spec: Binding) -> Any:
    """A place in the recurrent block's forward (the RG-LRU's parent), found by what it binds."""
    return Place(spec, module="..")


def _conv_state_key(envoy: "RgLru") -> str:
    """The block's binding of the conv state on the arm this call takes: the prompt's window, or the decode step's."""
    forward = ForwardSource.of(type(envoy.parent._module).forward)
    arms = [
        op for op in forward.bindings("self.conv1d_state") if any("position_ids.shape[1]" in a.test for a in op.arms)
    ]
    prompt = [op for op in arms if any(a.taken for a in op.arms if "position_ids.shape[1]" in a.test)]
    decode = [op for op in arms if op not in prompt]
    chosen = decode if envoy.decoding() else prompt
    if len(chosen) != 1:
        raise Unavailable(
            f"conv_state on {standard_path(envoy)}: {type(envoy.parent._module).__name__}'s forward in this "
            "transformers binds self.conv1d_state otherwise than once on each arm of its prompt/decode test"
        )
    return f"../source.{chosen[0].label}.output"


class RgLru(RecurrentMixer):
    """A Griffin / RecurrentGemma RG-LRU: a real-gated, diagonal linear recurrence over ``channels`` (``lru_width``).

    The recurrent block splits its input in two branches: ``y = gelu(linear_y(u))``
    (``output_gates``) and ``x = conv1d(linear_x(u))``, a depthwise causal
    convolution (``conv_output``). The RG-LRU computes per token and channel an
    input gate ``i_t`` (``input_gates``) and a recurrence gate
    ``a_t = exp(-8 r_t softplus(c))`` (``recurrence_gates``; its log is
    ``decays``), then runs::

        h_t = a_t * h_{t-1} + sqrt(1 - a_t^2) * (i_t * x_t)

    with ``a_t`` taken as 0 and the square root as 1 at a document's first token
    (``position_ids == 0``), where the state starts over. ``h_t`` is the scan's
    output (``attention_head_outputs``); ``linear_out(h * y)`` is what the block
    adds to the residual stream (``attention_output``).

    The scan is the method ``self._rnn_scan(hidden_states, recurrent_gate, reset,
    recurrent_states)``: one declaration serves prompts and decode steps, the
    method looping over a prompt's tokens (binding the state after each) and
    taking one step without a loop on a one-token call. ``attention_values`` is
    its input ``sqrt(1 - a_t^2) * i_t * x_t``, what each token writes, and
    ``token_mixing`` is exact over it. The state lives on the module
    (``rg_lru.recurrent_states``), not in a cache object: ``state_input`` is
    the one the scan starts from, ``state_output`` the one the module keeps.
    """

    # the prompt's loop binds the state after each token; a one-token call takes a branch without a loop
    PROMPT = KernelCall("self._rnn_scan", "recurrent_states", Binding("recurrent_states", loop=True))
    DECODE = KernelCall("self._rnn_scan", "recurrent_states")
    # a plain-torch method looping over a prompt's tokens: every state is bound, always
    PER_TOKEN = ALWAYS
    MIXING_HEADS = CHANNELS
    KIND = "RG-LRU scan"
    CONTRIBUTION = "../linear_out.output"
    ORDER = (
        ("output_gates",),
        ("conv_state",),
        ("conv_output",),
        ("input_gates",),
        (*CALL_ARGUMENTS, "recurrence_gates"),
        ("state", "states"),
        ("attention_head_outputs", "state_output"),
    )

    # -- sizes ----------------------------------------------------------------------

    @property
    def channels(self) -> int:
        """Width of the recurrence: the config's ``lru_width``."""
        return self._module.recurrent_param.shape[0]

    @property
    def conv_window(self) -> int:
        """Inputs the conv state holds: ``conv1d_width - 1``."""
        return self.parent._module.conv1d_width - 1

    # -- the call: a method of the module, one for prompts and decode steps ------------------

    def forward_call(self) -> tuple[int, Any]:
        """This call's length, read at the recurrent block's input, before any of the values (no cache: the state
        lives on the module)."""
        return per_call(self, "forward call", lambda: (self.parent.inputs[0][0].shape[1], None))

    def kernel_call(self) -> KernelCall:
        """The scan's own test: one token takes the step without a loop (``DECODE``), several the token loop."""
        cls = type(self)
        return per_call(self, "kernel", lambda: cls.DECODE if self.forward_call()[0] == 1 else cls.PROMPT)

    def kernel_call_argument(self, name: str) -> BoundArgument:
        """The ``select`` of the scan's argument ``name``: found by the method's signature, past ``self``."""
        return BoundArgument(_method_signature(self._scan_function()), self.located().call.parameter(name))

    def _scan_function(self) -> Any:
        return kernel_function(type(self._module), self.located())

    def _dispatcher_hop(self) -> str | None:
        return None

    def body_source(self) -> ForwardSource:
        return ForwardSource.of(self._scan_function())

    def _prompt_length(self, args: tuple, kwargs: dict) -> int:
        return self.argument("hidden_states", (args, kwargs)).shape[1]

    # -- order: the block's and the RG-LRU's values before the scan call --------------------

    def check_order(self, name: str) -> None:
        """``CallOrder.check_order``, but values produced before the scan call do not wait for its arguments."""
        if name not in (*BEFORE_THE_CALL, "conv_state"):
            super().check_order(name)
            return
        where = f"{name} on {standard_path(self)}"
        if self._returned():
            raise OrderError(f"{where} was asked for after this call of the mixer returned; {self.order_hint(name)}")
        furthest = self._peek("furthest")
        if furthest is None and self._between_calls():
            furthest = self._peek("furthest", current_call(self) - 1)
        if furthest is not None and furthest.stage > self._stage(name):
            raise OrderError(
                f"{where} was asked for after {furthest.last}, which this call's forward produces later; "
                f"{self.order_hint(name)}"
            )
        # which branch the call takes is read at the block's input, before any of these
        self.kernel_call()

    # -- before the scan ----------------------------------------------------------------

    @EProperty(_parent_place(Binding("y_branch")), unavailable=_parent_place(Binding("y_branch")).reason)
    def output_gates(self, value: Any) -> ScanValues:
        """y = gelu(linear_y(u)), [batch, seq, channels]: the block's gate on the scan's output.

        Read in the recurrent block's forward, before the RG-LRU runs. Assign,
        or edit in place.
        """
        return value

    @EProperty(_conv_state_key, unavailable=needs_kernel_call)
    def conv_state(self, value: Any) -> ConvState:
        """The convolution's state, [batch, channels, conv1d_width - 1]: the last inputs it keeps for the next call.

        The block's ``conv1d_state`` as this call binds it: on a prompt the last
        ``conv1d_width - 1`` inputs of ``linear_x`` (zero-padded on the left),
        bound before the convolution runs; on a decode step the window rolled
        by one, bound after the convolution read it. Either way before the
        RG-LRU runs, so it is read after ``output_gates`` and before the rest.
        Assigning it changes what the next decode step convolves with.
        """
        return value

    @EProperty("input", unavailable=needs_kernel_call)
    def conv_output(self, value: Any) -> ScanValues:
        """x, the convolution's output, [batch, seq, channels]: the RG-LRU's input, which its gates read.

        Assigning it changes the gates too, which are computed from it.
        """
        return value

    @EProperty(Place(Binding("input_gate")), unavailable=needs_kernel_call)
    def input_gates(self, value: Any) -> ScanValues:
        """i_t = sigmoid(W_x x_t + b_x) per block of channels, [batch, seq, channels]: how much of x each token writes.

        Assign, or edit in place: the scan's input follows.
        """
        return value

    # -- at the scan call ---------------------------------------------------------------

    @EProperty(kernel("inputs"), unavailable=needs_kernel_call, select=argument("hidden_states"))
    def attention_values(self, value: Any) -> ScanValues:
        """What each token writes into the state, [batch, seq, channels]: ``sqrt(1 - a_t^2) * i_t * x_t``.

        The scan's input (``x_t`` alone, times ``i_t``, at a document's first
        token). Assign, or edit in place: the state follows, the gates do not.
        """
        return value

    @EProperty(kernel("inputs"), unavailable=needs_kernel_call, select=argument("recurrent_gate"))
    def recurrence_gates(self, value: Any) -> ScanValues:
        """a_t = exp(-8 r_t softplus(c)), [batch, seq, channels]: how much of the state each token keeps.

        The scan's argument, before it zeroes it at a document's first token.
        Assigning it changes the recurrence, not ``attention_values``'
        normalization, which was computed from the gate before the call.
        """
        return value

    def _decays(self) -> ScanValues:
        """log a_t, [batch, seq, channels]: the log of how much of the state each token keeps; derived, read-only."""
        return torch.log(self.argument("recurrent_gate"))

    decays = DerivedEProperty(_decays, unavailable=needs_kernel_call)

    @EProperty(kernel("inputs"), unavailable=needs_kernel_call, select=argument(ENTERING_STATE))
    def state_input(self, value: Any) -> LruState:
        """The state the scan starts from, [batch, channels], float32: the module's ``recurrent_states``.

        Zeros on a prompt the model set a cache up for (and dropped at its
        first token, a document start); the state the last call left on a
        decode step; ``None`` without a cache. Assign, or edit in place, to
        start the call from another state (a prompt starting at position 0
        resets it at its first token).
        """
        return value

    @EProperty(kernel("output"), unavailable=needs_kernel_call, select=0)
    def attention_head_outputs(self, value: Any) -> ScanValues:
        """h_t, the scan's output, [batch, seq, channels]: the state after each token, before the ``y`` gate.

        Assign, or edit in place.
        """
        return value

    @EProperty(kernel("output"), unavailable=needs_kernel_call, select=1)
    def state_output(self, value: Any) -> LruState:
        """The state after the call's last token, [batch, channels], float32: what the module keeps for the next call.

        Assign, or edit in place: the next decode step starts from it (the
        RG-LRU stores the scan's returned state as ``recurrent_states``).
        """
        return value

    # -- the state after every token -------------------------------------------------------

    state = RecurrentMixer.state.laid_out(LruState)
    state_trajectory = RecurrentMixer.state_trajectory.laid_out(LruStates)

    def _states(self) -> LruStates:
        """The state after every token of this call, [batch, seq, channels]: the scan loop's own, or a decode step's.

        A one-token call has no loop: its state is computed from its arguments.
        """
        if self.decoding():
            self.check_order("states")
            return self.trajectory()
        return super()._states()

    states = DerivedEProperty(_states, unavailable=needs_kernel_call).laid_out(LruStates)

    def state_after(self, t: int) -> LruState:
        """The state after token ``t`` of this call (``RecurrentMixer.state_after``; a decode step's from its arguments)."""
        if self.decoding():
            self._position("state_after", t)
            return self.trajectory(positions=t)
        return super().state_after(t)

    def set_state_after(self, t: int, value: torch.Tensor) -> None:
        """Assign the state after token ``t``: later tokens continue from ``value`` [batch, channels].

        On a decode step there is no token loop to write into: write
        ``state_output`` instead.
        """
        if self.decoding():
            raise Unavailable(DECODE_STATE.format(what=f"set_state_after({t})", path=standard_path(self)))
        super().set_state_after(t, value)

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> LruStates:
        """The scan's states after ``positions`` (``rglru_states``), from its arguments; float32 unless ``dtype``."""
        return rglru_states(
            self.argument("hidden_states"),
            self.argument("recurrent_gate"),
            self.argument("reset"),
            self.entering_state(),
            positions=positions,
            dtype=dtype,
        )

    # -- token mixing -----------------------------------------------------------------------

    def token_mixing(self, positions: Positions = None, heads: Heads = None) -> ScanMixing:
        """``RecurrentMixer.token_mixing`` over the scan's inputs (``attention_values``), a row per channel.

        ``M[b, c, t, j] = prod_{j < k <= t} a_k`` (zero across a document
        start): exact, since each channel is its own linear recurrence once the
        gates are fixed. The ``y`` gate and the input normalization stay
        outside it; the readout of ``state_input`` is the offset.
        """
        return super().token_mixing(positions, heads)

    def mixing_from_arguments(self, rows: torch.Tensor, heads: torch.Tensor) -> TokenMixing:
        return rglru_mixing(self.argument("recurrent_gate"), self.argument("reset"), self.entering_state(), rows, heads)

    def readout_from_arguments(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The scan's output at ``rows`` were ``state`` the state after each: the state itself (no query reads it)."""
        return rglru_readout(state, rows)

    # -- state patching and continuing a prompt --------------------------------------------------

    @classmethod
    def prompt_continues_from_cache(cls) -> bool:
        """No: a call of several tokens convolves them from a zero window, not the conv state the last call left
        (the block's prompt arm), so a continuation runs one token at a time, as ``generate`` does."""
        return False

    @classmethod
    def continuation_cache(cls, model: Any) -> Any:
        """A ``DynamicCache`` for the attention blocks' keys: RecurrentGemma's forward returns none, and without one
        given it zeroes the recurrent blocks' states (``_setup_cache``), which live on the modules."""
        return DynamicCache(config=model._module.config.get_text_config())

    def carried(self) -> dict[str, torch.Tensor]:
        """What a recurrent block carries past the call's last token: the conv window and the RG-LRU state after it.

        ``"conv_state"`` the last ``conv1d_width - 1`` inputs of the
        convolution, [batch, channels, conv_window] (``conv_state``), which the
        next token convolves with; ``"state"`` the RG-LRU's state,
        [batch, channels] (``trajectory(positions=-1)``). Save each.
        """
        window = self.conv_state
        return {"conv_state": window, "state": self.trajectory(positions=-1)}

    def carry(self, carried: dict[str, torch.Tensor], heads: Any) -> torch.Tensor:
        """The next call continues from ``carried`` at the channels ``heads``: the conv window the block keeps, then
        the RG-LRU state as ``RecurrentMixer.carry`` writes it (token t's output is the state after it)."""
        window = self.conv_state.clone()
        window[:, heads] = carried["conv_state"].to(window)[:, heads]
        self.conv_state = window
        return super().carry(carried, heads)

    def knock_out(self, positions: torch.Tensor) -> None:
        """Take token ``positions[b]`` of each row ``b`` out of later tokens: zero what it writes."""
        values = self.attention_values
        knocked = knocked_tokens(positions, values, f"{standard_path(self)}.attention_values")
        self.attention_values = values.masked_fill(knocked[..., None], 0)


@functools.cache
def _method_signature(function: Any) -> inspect.Signature:
    """A method's signature as its bound calls pass arguments: without ``self``."""
    signature = inspect.signature(function)
    return signature.replace(parameters=list(signature.parameters.values())[1:])
