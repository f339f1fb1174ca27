"""MatrixMemory: an xLSTM mLSTM layer's values, read at its call of the mLSTM backend module and around it."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from nnterp import DerivedEProperty, EProperty, RecurrentMixer, Unavailable, unavailable
from nnterp.analysis.knockout import knocked_tokens
from nnterp.analysis.mixing import Heads, TokenMixing
from nnterp.availability import inside_trace
from nnterp.components.call_order import CALL_ARGUMENTS
from nnterp.components.call_site import CallSite, argument, forward_arguments, needs_kernel_call
from nnterp.components.declaration import mismatch_message
from nnterp.components.per_call import per_call, replace_per_call
from nnterp.components.per_token import ALWAYS
from nnterp.forward_source import ForwardSource, NotInForward
from nnterp.layouts import (
    BATCH,
    KEY_DIM,
    MIXER_HEADS,
    SEQ,
    VALUE_DIM,
    Gates,
    LinearHeadOutputs,
    LinearQK,
    LinearV,
    Mixing,
    State,
    States,
)
from nnterp.order import OrderError, standard_path
from nnterp.positions import Positions, select_positions
from nnterp.value_paths import BoundArgument

from .recurrence import denominators, mlstm_mixing, mlstm_readout, mlstm_states

Normalizer = Float[Tensor, f"{BATCH} {MIXER_HEADS} {KEY_DIM}"]
Normalizers = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS} {KEY_DIM}"]
Stabilizer = Float[Tensor, f"{BATCH} {MIXER_HEADS}"]
Stabilizers = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS}"]
OutputGates = Float[Tensor, f"{BATCH} {SEQ} {MIXER_HEADS} {VALUE_DIM}"]

#: The submodule calls the layer's forward makes, by the attribute each is called through.
BACKEND, NORM, OUTPUT_GATE = "mlstm_backend", "multihead_norm", "ogate_act_fn"

NO_CACHE = (
    "this call ran without a cache (use_cache=False), so the backend starts from zeros and no state is passed in; "
    "trace with use_cache=True"
)
NO_TOKEN_PLACE = (
    "the mLSTM backend runs its kernels as functools.partial objects bound on the module, which nnsight cannot "
    "drill into, so no place holds the state after a token; read states or state_after(t), and write "
    "set_state_after(t, value)"
)


@functools.cache
def forward_labels(module_class: type) -> dict[str, str]:
    """The labels of the layer forward's one call of each submodule the values are read at.

    Raises:
        NotInForward: the forward makes no such call, or several.
    """
    source = ForwardSource.of(module_class.forward)
    labels = {}
    for attribute in (BACKEND, NORM, OUTPUT_GATE):
        found = source.calls(f"self.{attribute}")
        if len(found) != 1:
            raise NotInForward(f"one call of self.{attribute} in {source.name}; found {len(found)}")
        labels[attribute] = found[0].label
    return labels


@functools.cache
def _backend_signature(backend_class: type) -> inspect.Signature:
    """The backend's ``forward`` signature without ``self``: how the layer's call binds its arguments."""
    signature = inspect.signature(backend_class.forward)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _tokens_first(value: torch.Tensor) -> torch.Tensor:
    """A kernel tensor [batch, heads, seq, ...] as a view [batch, seq, heads, ...]."""
    return value.transpose(1, 2)


class MatrixMemory(RecurrentMixer):
    """An xLSTM mLSTM layer: per head a matrix memory with exponential input and sigmoid forget gates.

    Per token ``t`` and head, with ``q``, ``k``, ``v`` the projections split
    into heads, ``i_t`` and ``f_t`` the soft-capped gate pre-activations
    (``input_gates``, ``forget_gates``) and ``d`` the key width::

        m_t = max(logsigmoid(f_t) + m_{t-1}, i_t)
        C_t = exp(logsigmoid(f_t) + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T
        n_t = exp(logsigmoid(f_t) + m_{t-1} - m_t) n_{t-1} + exp(i_t - m_t) k_t
        h_t = (q_t / sqrt(d)) C_t / (max(|(q_t / sqrt(d)) . n_t|, exp(-m_t)) + eps)

    ``C`` [heads, key_dim, value_dim] is the memory (``state``, ``states``,
    ``state_input``, ``state_output``), ``n`` [heads, key_dim] the normalizer
    and ``m`` [heads] the stabilizer, a running max that keeps the
    exponentials finite (``normalizer_*`` and ``stabilizer_*``). ``h`` is the
    head outputs; the layer then applies a per-head layer norm, multiplies by
    the output gate ``sigmoid(o)`` (``output_gates``) and projects with
    ``out_proj`` (``attention_output``).

    The layer's forward calls its backend module ``self.mlstm_backend(query=,
    key=, value=, igate=, fgate=, c_initial=, n_initial=, m_initial=)`` on
    prompts and decode steps alike; the backend picks its kernel inside by the
    call's length: one token runs the step kernel, a prompt the chunkwise
    kernel over whole chunks of ``chunk_size`` tokens and the recurrent
    sequence kernel (a loop over tokens) over the rest. The values are that
    call's arguments and results: its kernels are ``functools.partial``
    objects bound on the backend, which nnsight cannot drill into, so the
    state after each token is computed from the arguments (exactly, by the
    recurrence above) rather than read, and ``set_state_after`` writes through
    the recurrence's linearity in ``C``.
    """

    PROMPT = None
    DECODE = None
    PER_TOKEN = ALWAYS
    KIND = "mLSTM"
    ORDER = (
        (*CALL_ARGUMENTS, "input_gates", "forget_gates", "normalizer_input", "stabilizer_input"),
        ("state", "states"),
        ("attention_head_outputs",),
        ("output_gates",),
        ("state_output", "normalizer_output", "stabilizer_output"),
    )

    # -- sizes ---------------------------------------------------------------------

    @property
    def mixer_heads(self) -> int:
        """Heads of the mLSTM, each with its own memory: the config's ``num_heads``."""
        return self._module.config.num_heads

    @property
    def key_dim(self) -> int:
        """Width of a head's queries and keys: ``qk_dim // num_heads``."""
        return self._module.qk_dim // self.mixer_heads

    @property
    def value_dim(self) -> int:
        """Width of a head's values: ``v_dim // num_heads``."""
        return self._module.v_dim // self.mixer_heads

    # -- the declaration: the layer's call of its backend --------------------------------------

    @classmethod
    def calls(cls) -> tuple:
        """No kernel function by name: the forward calls its backend module, whose kernels are per-instance partials."""
        return ()

    @classmethod
    def forward_mismatch(cls, module_class: type) -> str | None:
        """Why the installed forward does not make the calls this kind reads, or ``None``: what ``nnterp check`` reports."""
        try:
            forward_labels(module_class)
        except NotInForward as error:
            return mismatch_message(
                cls,
                module_class,
                str(error),
                "reads the mLSTM at the layer's calls of its backend, norm and output gate",
            )
        return None

    @property
    def source(self) -> Any:
        """nnsight's ``.source`` of the forward (no kernel call to expose on the way)."""
        return super(CallSite, self).source

    def _backend(self) -> Any:
        return getattr(self, BACKEND)

    # -- the call ----------------------------------------------------------------------

    def forward_call(self) -> tuple[int, Any]:
        """This call's length and the (C, n, m) state it was given (``None`` without a cache)."""

        def read() -> tuple[int, Any]:
            hidden, state = forward_arguments(self.inputs)
            return hidden.shape[1], state

        return per_call(self, "forward call", read)

    def kernel_call(self) -> str:
        """The backend's kernel for this call: ``"step"`` for one token, ``"sequence"`` for several."""
        return per_call(self, "kernel", lambda: "step" if self.forward_call()[0] == 1 else "sequence")

    def decoding(self) -> bool:
        """Whether the backend runs its one-token step kernel (every decode step of ``generate``)."""
        return self.kernel_call() == "step"

    def call_length(self) -> int:
        """This call's tokens: the layer's input length."""
        return self.forward_call()[0]

    def segmented(self) -> bool:
        return False

    def spans_calls(self, value: Any) -> bool:
        return False

    def calls_per_forward(self) -> int:
        return 1

    def kernel_call_argument(self, name: str) -> BoundArgument:
        """The ``select`` of the backend call's argument ``name``, found by the backend's ``forward`` signature."""
        return BoundArgument(_backend_signature(type(self._backend()._module)), name)

    def call_arguments(self) -> tuple[tuple, dict]:
        """The ``(args, kwargs)`` of the backend call, read once per call, with a copy of the state it starts from."""
        self.kernel_call()
        arguments = per_call(self, "arguments", lambda: self._backend().inputs)
        per_call(self, "entering_state", lambda: self._copied_state(arguments))
        return arguments

    def _copied_state(self, arguments: tuple[tuple, dict]) -> tuple[torch.Tensor, ...] | None:
        # the cache's buffers, which the model overwrites with the call's final state once the block returns
        entering = tuple(self.argument(name, arguments) for name in ("c_initial", "n_initial", "m_initial"))
        return None if entering[0] is None else tuple(state.clone() for state in entering)

    def entering_state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The (C, n, m) the backend call started from, a copy taken at the call's start; ``None`` without a cache."""
        self.call_arguments()
        return per_call(self, "entering_state", lambda: None)

    def replaced(self, location: str, value: Any) -> None:
        """An assignment to the backend call's arguments replaces the recorded ones: what is computed follows."""
        backend = self._backend()
        if location == type(backend).inputs._location(backend):
            replace_per_call(self, "arguments", value)
            replace_per_call(self, "entering_state", self._copied_state(value))

    def eps(self) -> float:
        """The backend's ``eps``, added to the readout's denominator."""
        return self._module.config.eps

    # -- the values at the backend call's arguments ------------------------------------------

    @EProperty(f"{BACKEND}.inputs", unavailable=needs_kernel_call, select=argument("query"))
    def attention_queries(self, value: Any) -> LinearQK:
        """q, what each token reads the memory with, [batch, seq, heads, key_dim], before the kernel's 1/sqrt(key_dim).

        A view of the backend's argument: assign, or edit in place under ``torch.no_grad()``.
        """
        return _tokens_first(value)

    @attention_queries.postprocess
    def attention_queries(self, value: torch.Tensor) -> torch.Tensor:
        return _tokens_first(value)

    @EProperty(f"{BACKEND}.inputs", unavailable=needs_kernel_call, select=argument("key"))
    def attention_keys(self, value: Any) -> LinearQK:
        """k, where each token writes into the memory and the normalizer, [batch, seq, heads, key_dim].

        Assign, or edit in place under ``torch.no_grad()``.
        """
        return _tokens_first(value)

    @attention_keys.postprocess
    def attention_keys(self, value: torch.Tensor) -> torch.Tensor:
        return _tokens_first(value)

    @EProperty(f"{BACKEND}.inputs", unavailable=needs_kernel_call, select=argument("value"))
    def attention_values(self, value: Any) -> LinearV:
        """v, what each token writes into the memory, [batch, seq, heads, value_dim].

        Assign, or edit in place under ``torch.no_grad()``.
        """
        return _tokens_first(value)

    @attention_values.postprocess
    def attention_values(self, value: torch.Tensor) -> torch.Tensor:
        return _tokens_first(value)

    @EProperty(f"{BACKEND}.inputs", unavailable=needs_kernel_call, select=argument("igate"))
    def input_gates(self, value: Any) -> Gates:
        """The input gate's pre-activation ``i_t`` after the soft cap, [batch, seq, heads]: the gate is ``exp(i_t)``.

        Assign, or edit in place.
        """
        return _tokens_first(value)

    @input_gates.postprocess
    def input_gates(self, value: torch.Tensor) -> torch.Tensor:
        return _tokens_first(value)

    @EProperty(f"{BACKEND}.inputs", unavailable=needs_kernel_call, select=argument("fgate"))
    def forget_gates(self, value: Any) -> Gates:
        """The forget gate's pre-activation ``f_t`` after the soft cap, [batch, seq, heads]: the gate is ``sigmoid(f_t)``.

        Assign, or edit in place.
        """
        return _tokens_first(value)

    @forget_gates.postprocess
    def forget_gates(self, value: torch.Tensor) -> torch.Tensor:
        return _tokens_first(value)

    def _decays(self) -> Gates:
        """``logsigmoid(f_t)``, the log of what the memory keeps per token, [batch, seq, heads]; derived, read-only."""
        return F.logsigmoid(_tokens_first(self.argument("fgate")))

    decays = DerivedEProperty(_decays, unavailable=needs_kernel_call)

    def _betas(self) -> Gates:
        """``exp(i_t)``, the unstabilized input gate (how strongly token t writes), [batch, seq, heads]; read-only."""
        return torch.exp(_tokens_first(self.argument("igate")))

    betas = DerivedEProperty(_betas, unavailable=needs_kernel_call)

    def _entering(self, index: int) -> torch.Tensor | None:
        entering = self.entering_state()
        return None if entering is None else entering[index].clone()

    def _write_entering(self, name: str, value: torch.Tensor) -> torch.Tensor:
        if self.argument(name) is None:
            raise ValueError(f"{name} on {standard_path(self)}: {NO_CACHE}")
        return value

    @EProperty(f"{BACKEND}.inputs", unavailable=needs_kernel_call, select=argument("c_initial"))
    def state_input(self, value: Any) -> State | None:
        """The memory C the call starts from, [batch, heads, key_dim, value_dim]: a copy; ``None`` without a cache.

        A prompt with a cache starts from the cache's zeros, a decode step
        from the state the previous call left. Assigning it replaces what the
        backend starts from (the normalizer and stabilizer stay).
        """
        return self._entering(0)

    @state_input.postprocess
    def state_input(self, value: torch.Tensor) -> torch.Tensor:
        return self._write_entering("c_initial", value)

    @EProperty(f"{BACKEND}.inputs", unavailable=needs_kernel_call, select=argument("n_initial"))
    def normalizer_input(self, value: Any) -> Normalizer | None:
        """The normalizer n the call starts from, [batch, heads, key_dim]: a copy; ``None`` without a cache. Assignable."""
        return self._entering(1)

    @normalizer_input.postprocess
    def normalizer_input(self, value: torch.Tensor) -> torch.Tensor:
        return self._write_entering("n_initial", value)

    @EProperty(f"{BACKEND}.inputs", unavailable=needs_kernel_call, select=argument("m_initial"))
    def stabilizer_input(self, value: Any) -> Stabilizer | None:
        """The stabilizer m the call starts from, [batch, heads] (the kernel's [.., 1] squeezed): a copy; ``None``
        without a cache. Assignable."""
        entering = self._entering(2)
        return None if entering is None else entering[..., 0]

    @stabilizer_input.postprocess
    def stabilizer_input(self, value: torch.Tensor) -> torch.Tensor:
        return self._write_entering("m_initial", value[..., None])

    # -- the backend call's results -------------------------------------------------------------

    def _backend_output(self) -> str:
        self.call_arguments()
        return f"{BACKEND}.output"

    @EProperty(_backend_output, unavailable=needs_kernel_call, select=0)
    def attention_head_outputs(self, value: Any) -> LinearHeadOutputs:
        """h, each head's read of its memory, [batch, seq, heads, value_dim]: the backend's output before the norm.

        Assign, or edit in place.
        """
        return _tokens_first(value)

    @attention_head_outputs.postprocess
    def attention_head_outputs(self, value: torch.Tensor) -> torch.Tensor:
        return _tokens_first(value)

    def _gate_key(self) -> str:
        self.call_arguments()
        return f"{OUTPUT_GATE}.output"

    @EProperty(_gate_key, unavailable=needs_kernel_call)
    def output_gates(self, value: Any) -> OutputGates:
        """sigmoid(o), what multiplies the normed head outputs, [batch, seq, heads, value_dim].

        Assign, or edit in place.
        """
        return value.unflatten(-1, (self.mixer_heads, self.value_dim))

    @output_gates.postprocess
    def output_gates(self, value: torch.Tensor) -> torch.Tensor:
        return value.flatten(-2)

    def _state_key(self) -> str:
        self.call_arguments()
        return "output"

    def _served_state(self, value: tuple, index: int) -> torch.Tensor:
        # the final (C, n, m) as the layer returns it, kept for an assignment to one of them
        replace_per_call(self, "final state", value)
        return value[index]

    def _placed_state(self, index: int, value: torch.Tensor) -> tuple:
        final = list(self._peek("final state"))
        final[index] = value.to(final[index])
        return tuple(final)

    @EProperty(_state_key, unavailable=needs_kernel_call, select=1)
    def state_output(self, value: Any) -> State:
        """The memory C after the call's last token, [batch, heads, key_dim, value_dim], as the layer returns it.

        The model copies it into the cache after the block: assigning it, or
        editing it in place, changes what the next call starts from, not this
        call's outputs.
        """
        return self._served_state(value, 0)

    @state_output.postprocess
    def state_output(self, value: torch.Tensor) -> tuple:
        return self._placed_state(0, value)

    @EProperty(_state_key, unavailable=needs_kernel_call, select=1)
    def normalizer_output(self, value: Any) -> Normalizer:
        """The normalizer n after the call's last token, [batch, heads, key_dim]; assignable like ``state_output``."""
        return self._served_state(value, 1)

    @normalizer_output.postprocess
    def normalizer_output(self, value: torch.Tensor) -> tuple:
        return self._placed_state(1, value)

    @EProperty(_state_key, unavailable=needs_kernel_call, select=1)
    def stabilizer_output(self, value: Any) -> Stabilizer:
        """The stabilizer m after the call's last token, [batch, heads]; assignable like ``state_output``."""
        return self._served_state(value, 2)[..., 0]

    @stabilizer_output.postprocess
    def stabilizer_output(self, value: torch.Tensor) -> tuple:
        return self._placed_state(2, value[..., None])

    # -- the state after every token ------------------------------------------------------

    state = unavailable(NO_TOKEN_PLACE)

    def _states(self) -> States:
        """The memory C after every token of this call, [batch, seq, heads, key_dim, value_dim], computed exactly.

        From the backend call's arguments and entering state, as
        ``state_trajectory``; after ``set_state_after`` in the same call it
        raises, the write being in none of them.
        """
        return self._recomputed("states", None)

    states = DerivedEProperty(_states, unavailable=needs_kernel_call)

    def _state_trajectory(self) -> States:
        """The memory C after every token of this call, from its arguments; no routing needed."""
        return self.trajectory()

    state_trajectory = DerivedEProperty(_state_trajectory, unavailable=needs_kernel_call)

    def _normalizers(self) -> Normalizers:
        """The normalizer n after every token of this call, [batch, seq, heads, key_dim], computed exactly."""
        inside_trace(self, "normalizers")
        with torch.no_grad():
            return self._recurrence(None, None)[1]

    normalizers = DerivedEProperty(_normalizers, unavailable=needs_kernel_call)

    def _stabilizers(self) -> Stabilizers:
        """The stabilizer m after every token of this call, [batch, seq, heads], computed exactly."""
        inside_trace(self, "stabilizers")
        with torch.no_grad():
            return self._recurrence(None, None)[2][..., 0]

    stabilizers = DerivedEProperty(_stabilizers, unavailable=needs_kernel_call)

    def _recurrence(self, positions: Positions, dtype: torch.dtype | None) -> tuple[torch.Tensor, ...]:
        """(C, n, m) after ``positions`` (``mlstm_states``), in ``dtype`` or the state's dtype, float32 at least."""
        arguments = [self.argument(name) for name in ("key", "value", "igate", "fgate")]
        chosen, order, single = select_positions(positions, self.call_length())
        entering = self.entering_state()
        wanted = dtype or (entering[0].dtype if entering is not None else torch.float32)
        work = torch.promote_types(wanted, torch.float32)
        results = [state.to(wanted) for state in mlstm_states(*arguments, entering, chosen, work)]
        if order is not None:
            results = [state[:, order] for state in results]
        return tuple(state[:, 0] if single else state for state in results)

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> States:
        """The memory after ``positions`` of this call (``mlstm_states``)."""
        return self._recurrence(positions, dtype)[0]

    def state_after(self, t: int) -> State:
        """The memory C after token ``t`` of this call, [batch, heads, key_dim, value_dim], computed exactly."""
        return self._recomputed(f"state_after({t})", self._position("state_after", t))

    def set_state_after(self, t: int, value: torch.Tensor) -> None:
        """Make the memory after token ``t`` be ``value``: token ``t``'s output and every later one read it.

        The head outputs are linear in the memory once the normalizer and
        stabilizer are fixed, and the memory is carried on linearly, so the
        change ``D = value - C_t`` adds ``exp(F_i - F_t + m_t - m_i) (q_i / sqrt(d)) D / den_i``
        to the head output of each token ``i >= t`` and the same decay to
        ``D`` in the final memory, where the backend returns them; the
        normalizer and stabilizer stay as the model computed them. Write
        before reading ``attention_head_outputs`` or any later value of the
        call, once per call.
        """
        position = self._position("set_state_after", t)
        where = f"set_state_after({t}) on {standard_path(self)}"
        furthest = self._peek("furthest")
        if self._returned() or (furthest is not None and furthest.stage > self._stage("states")):
            raise OrderError(
                f"{where}: the forward has passed token {t}; write the state before reading "
                f"attention_head_outputs or any later value of this call ({self.order_hint('set_state_after')})"
            )
        if self._peek("state written"):
            raise OrderError(f"{where}: this call's state was already written; write one state per call")
        with torch.no_grad():
            memory, normalizer, stabilizer = self._recurrence(slice(position, None), torch.float32)
            if tuple(value.shape) != tuple(memory[:, 0].shape):
                raise ValueError(
                    f"{where}: the memory is [batch, heads, key_dim, value_dim] = {list(memory[:, 0].shape)}, "
                    f"got {list(value.shape)}"
                )
            change = value.float() - memory[:, 0]
            query, fgate = self.argument("query").float(), self.argument("fgate").float()
            rows = torch.arange(position, self.call_length())
            # how much of the memory after t is left at each later token, stabilized as the kernel stabilizes it
            kept = F.logsigmoid(fgate[..., rows]).cumsum(-1) - F.logsigmoid(fgate[..., position, None])
            decay = torch.exp(kept + stabilizer[:, :1, :, 0].transpose(1, 2) - stabilizer[..., 0].transpose(1, 2))
            denominator = denominators(query[:, :, rows], normalizer, stabilizer, self.eps())
            effect = mlstm_readout(query[:, :, rows] * decay[..., None], change, denominator, torch.arange(len(rows)))
            carried = decay[..., -1, None, None] * change
        backend = self._backend()
        output = backend.output
        head_outputs, (final_memory, final_normalizer, final_stabilizer) = output
        written = head_outputs.clone()
        written[:, :, position:] += effect.transpose(1, 2).to(written)
        backend.output = (written, (final_memory + carried.to(final_memory), final_normalizer, final_stabilizer))
        self.record_order("states", written=True)

    # -- token mixing ----------------------------------------------------------------------

    def token_mixing(self, positions: Positions = None, heads: Heads = None) -> Mixing:
        """The exact token mixing of the head outputs, [batch, heads, rows, seq].

        ``M[t, j] = exp(F_t - F_j + i_j - m_t) (q_t . k_j) / sqrt(d) / den_t``
        for ``j <= t``, with ``F`` the cumulative log forget gate and ``den_t``
        the readout's denominator ``max(|q_t . n_t| / sqrt(d), exp(-m_t)) + eps``.
        The denominator is computed from the queries, keys and gates, not from
        the values, so with those fixed the head outputs are exactly linear
        in the values: ``mixed(M, attention_values) + mixing_offset() ==
        attention_head_outputs``. ``M * den_t`` is the mixing of the
        numerator ``q_t C_t / sqrt(d)`` alone (``readout_denominators``). The
        offset is the entering memory's readout, zero on a prompt from zeros.
        """
        return super().token_mixing(positions, heads)

    def _rows_of_call(self, what: str, positions: Positions) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        inside_trace(self, f"{what}()")
        reason = needs_kernel_call(self)
        if reason is not None:
            raise Unavailable(f"{what} on {standard_path(self)}: {reason}")
        return select_positions(positions, self.call_length())

    def _mixing_parts(self, rows: torch.Tensor, heads: torch.Tensor) -> tuple[torch.Tensor, ...]:
        query, key, igate, fgate = (self.argument(name) for name in ("query", "key", "igate", "fgate"))
        return mlstm_mixing(query, key, igate, fgate, self.entering_state(), rows, heads, self.eps())

    def mixing_from_arguments(self, rows: torch.Tensor, heads: torch.Tensor) -> TokenMixing:
        """The token mixing at ``rows`` and ``heads`` (``mlstm_mixing``), float32; the offset reads the entering memory."""
        matrix, _, reads = self._mixing_parts(rows, heads)
        entering = self.entering_state()
        if entering is None:
            offset = matrix.new_zeros((*reads.shape[:3], self.value_dim))
        else:
            offset = torch.einsum("bhtk,bhkv->bhtv", reads, entering[0].float()[:, heads])
        return TokenMixing(matrix, offset.transpose(1, 2))

    def readout_denominators(self, positions: Positions = None) -> torch.Tensor:
        """The readout's denominator ``max(|q_t . n_t| / sqrt(d), exp(-m_t)) + eps`` at ``positions``, [batch, rows, heads].

        What each head output's numerator ``q_t C_t / sqrt(d)`` is divided by;
        ``token_mixing() * den`` is the numerator's mixing.
        """
        rows, order, single = self._rows_of_call("readout_denominators", positions)
        with torch.no_grad():
            _, denominator, _ = self._mixing_parts(rows, torch.arange(self.mixer_heads))
        denominator = denominator.transpose(1, 2)
        if order is not None:
            denominator = denominator[:, order]
        return denominator[:, 0] if single else denominator

    def readout_from_arguments(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``q_t state / sqrt(d) / den_t`` at ``rows``: each row's query reading ``state`` with its own denominator."""
        _, denominator, _ = self._mixing_parts(rows, torch.arange(self.mixer_heads))
        return mlstm_readout(self.argument("query"), state, denominator, rows)

    # -- state patching ------------------------------------------------------------------------

    def carried(self) -> dict[str, torch.Tensor]:
        """What an mLSTM carries past the call's last token: its memory, normalizer and stabilizer after it.

        ``"state"`` the memory C, [batch, heads, key_dim, value_dim];
        ``"normalizer"`` n, [batch, heads, key_dim]; ``"stabilizer"`` m,
        [batch, heads]: computed exactly from the call's arguments, as
        ``states``, ``normalizers`` and ``stabilizers``. Save each.
        """
        inside_trace(self, "carried()")
        with torch.no_grad():
            memory, normalizer, stabilizer = self._recurrence(-1, None)
        return {"state": memory, "normalizer": normalizer, "stabilizer": stabilizer[..., 0]}

    def carry(self, carried: dict[str, torch.Tensor], heads: Any) -> torch.Tensor:
        """The next call continues from ``carried`` (``carried()``'s parts) at ``heads``, all three parts of a head
        together, the call's own elsewhere.

        Token t's output reads the memory after itself through the normalizer
        and stabilizer after itself, so it becomes the carried memory's
        answer to its query with the carried normalizer and stabilizer; the
        backend's final (C, n, m), which the model copies into the cache, are
        the carried ones.
        """
        inside_trace(self, "carry()")
        with torch.no_grad():
            parts = [part.clone() for part in self._recurrence(-1, torch.float32)]
            given = (carried["state"], carried["normalizer"], carried["stabilizer"][..., None])
            for own, theirs in zip(parts, given, strict=True):
                own[:, heads] = theirs.to(own)[:, heads]
            memory, normalizer, stabilizer = parts
            last = torch.tensor([self.call_length() - 1])
            query = self.argument("query").float()
            denominator = denominators(query[:, :, last], normalizer[:, None], stabilizer[:, None], self.eps())
            answer = mlstm_readout(query, memory, denominator, last)
        backend = self._backend()
        head_outputs, (final_memory, final_normalizer, final_stabilizer) = backend.output
        answered = head_outputs.clone()
        answered[:, :, -1] = answer[:, 0].to(answered)
        final = (memory.to(final_memory), normalizer.to(final_normalizer), stabilizer.to(final_stabilizer))
        backend.output = (answered, final)
        return memory

    def knock_out(self, positions: torch.Tensor) -> None:
        """Take token ``positions[b]`` of each row ``b`` out of what this call's later tokens read.

        A token writes into the memory and normalizer with ``exp(i_t) k_t``
        and raises the stabilizer to ``i_t`` at most: an input gate of
        ``-inf`` removes all three, where a zero key would leave the
        stabilizer's floor ``exp(-m)`` moved.
        """
        gates = self.input_gates
        knocked = knocked_tokens(positions, gates, f"{standard_path(self)}.input_gates")
        self.input_gates = gates.masked_fill(knocked.view(*knocked.shape, 1), -torch.inf)
