"""LightningAttention: MiniMax's lightning attention, read at the places of its own forward (it calls no kernel)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from nnsight.intervention.interleaver import Mediator

from nnterp import DerivedEProperty, EProperty, RecurrentMixer, Unavailable, unavailable
from nnterp.analysis.mixing import Heads, TokenMixing
from nnterp.availability import inside_trace
from nnterp.components.call_order import CALL_ARGUMENTS
from nnterp.components.call_site import CallSite, forward_arguments, needs_kernel_call
from nnterp.components.declaration import mismatch_message
from nnterp.components.per_call import per_call, pinned, replace_per_call
from nnterp.components.per_token import ALWAYS
from nnterp.components.states_memory import reusable_states
from nnterp.forward_source import Binding, Call, ForwardSource, NotInForward
from nnterp.layouts import Gates, LinearHeadOutputs, LinearQK, LinearV, Mixing, State, States
from nnterp.order import OrderError, standard_path
from nnterp.positions import Positions, select_positions
from nnterp.value_paths import resolve

from .recurrence import decay_powers, lightning_mixing, lightning_readout, lightning_states

#: The forward's split of the activated projection into queries, keys and values, [batch, seq, heads, head_dim] each.
SPLIT = Call("torch.split")
#: In the prompt's block loop: a block's outputs, and the state carried to the next block.
BLOCK_OUTPUT = Binding("current_attn_output", loop=True, under="attn_weights_inter is None")
BLOCK_STATE = Binding("attn_weights_inter", loop=True, under="attn_weights_inter is None")
#: In the loop over a cached state, one token at a time: the state after each token.
TOKEN_STATE = Binding("attn_weights_inter", loop=True)
#: The head outputs enter the output norm; the output gate is a sigmoid.
NORM = Call("self.norm")
GATE = Call("F.sigmoid")
#: The cache's methods, called on an argument named ``cache`` (5.25) or ``past_key_values`` (5.17).
CACHE_READ, CACHE_WRITE = "get_linear_cache", "set_linear_cache"

NO_STATE_PLACE = (
    "a prompt's forward binds the state only at block boundaries (every block_size tokens), not after each token; "
    "read states or state_after(t), and write set_state_after(t, value)"
)
NO_CACHE = (
    "this call ran without a cache (use_cache=False), so the forward hands no state to one; trace with "
    "use_cache=True, or read states[:, -1]"
)
NOT_ON_A_PROMPT = (
    "state_input on {path}: this call starts from an empty cache, with no state to replace; write the state after "
    "a token instead (set_state_after(t, value))"
)
NO_BETAS = "lightning attention writes every token with weight one: there is no per-token write strength"


def _cache_call(source: ForwardSource, method: str) -> Any:
    """The forward's one call of the cache's ``method``, whatever the cache argument is named."""
    found = [op for op in source.operations if op.called is not None and op.called.split(".")[-1] == method]
    if len(found) != 1:
        raise NotInForward(f"one call of the cache's {method} in {source.name}; found {len(found)}")
    return found[0]


@functools.cache
def forward_labels(module_class: type) -> dict[str, str]:
    """The labels of the places the values are read at, found in the installed forward by what they are.

    Raises:
        NotInForward: the forward holds no such place.
    """
    source = ForwardSource.of(module_class.forward)
    labels = {
        name: spec.find(source).label
        for name, spec in (
            ("split", SPLIT),
            ("block_output", BLOCK_OUTPUT),
            ("block_state", BLOCK_STATE),
            ("token_state", TOKEN_STATE),
            ("norm", NORM),
            ("gate", GATE),
        )
    }
    if labels["token_state"] == labels["block_state"]:
        raise NotInForward(f"a loop over a cached state, one token at a time, in {source.name}")
    labels["cache_read"] = _cache_call(source, CACHE_READ).label
    labels["cache_write"] = _cache_call(source, CACHE_WRITE).label
    return labels


class LightningAttention(RecurrentMixer):
    """MiniMax's lightning attention: linear attention with a fixed exponential decay per head.

    Per head ``h`` with rate ``s_h`` (the module's ``slope_rate`` buffer) and a
    state ``S`` of [head_dim, head_dim] numbers::

        S_t = exp(-s_h) S_{t-1} + k_t^T v_t
        o_t = q_t S_t

    ``q``, ``k`` and ``v`` are the activated projection ``act(qkv_proj(x))``
    split per head (zero at padding). ``o`` goes through the output norm, is
    gated by ``sigmoid(output_gate(x))`` and projected by ``out_proj``. A
    prompt runs in blocks of ``block_size`` tokens (a decay mask inside a
    block, the state carried from block to block); a call over a cached state
    runs token by token. Both are the recurrence above.

    The forward calls no kernel function, so the values are read at its own
    places, found by what they are: the split of the projection
    (``attention_queries``, ``attention_keys``, ``attention_values``), the
    input of the output norm (``attention_head_outputs``), the sigmoid
    (``output_gates``), the cache's ``set_linear_cache`` (``state_output``) and
    the cache's state as the forward is about to read it (``state_input``, at the split). The state after
    every token is computed from the queries, keys, values and slopes
    (``states``, ``state_after``, ``state_trajectory``), and written through
    linearity (``set_state_after``).
    """

    PROMPT = DECODE = None
    PER_TOKEN = ALWAYS
    KIND = "lightning attention"
    ORDER = (
        CALL_ARGUMENTS,
        ("state", "states"),
        ("attention_head_outputs",),
        ("output_gates",),
        ("state_output",),
    )

    # -- sizes ---------------------------------------------------------------------

    @property
    def mixer_heads(self) -> int:
        """Heads of the lightning attention, each with its own state and rate."""
        return self._module.num_attention_heads

    @property
    def key_dim(self) -> int:
        """Width of a head's queries and keys: the module's ``head_dim``."""
        return self._module.head_dim

    @property
    def value_dim(self) -> int:
        """Width of a head's values: the module's ``head_dim``."""
        return self._module.head_dim

    # -- the declaration: places in the forward, no kernel call -----------------------------------

    @classmethod
    def calls(cls) -> tuple:
        """No kernel calls: the forward computes inline, so ``route_kernels`` has nothing to bind for it."""
        return ()

    @classmethod
    def forward_mismatch(cls, module_class: type) -> str | None:
        """Why the installed forward does not hold the places this kind reads, or ``None``: what ``nnterp check`` reports."""
        try:
            forward_labels(module_class)
        except NotInForward as error:
            return mismatch_message(cls, module_class, str(error), "reads lightning attention at places of its forward")
        return None

    @property
    def source(self) -> Any:
        """nnsight's ``.source`` of the forward (no kernel call to expose on the way)."""
        return super(CallSite, self).source

    def _label(self, name: str) -> str:
        return forward_labels(type(self._module))[name]

    def _operation(self, name: str) -> Any:
        return getattr(self.source, self._label(name))

    # -- the call ----------------------------------------------------------------------

    def forward_call(self) -> tuple[int, Any]:
        """This call's length and cache, and the state the cache held for this block as the call started."""

        def read() -> tuple[int, Any]:
            hidden, cache = forward_arguments(self.inputs)
            entering = None if cache is None else cache.get_linear_cache(self._module.layer_idx)
            replace_per_call(self, "entering_state", entering if isinstance(entering, torch.Tensor) else None)
            return hidden.shape[1], cache

        return per_call(self, "forward call", read)

    def kernel_call(self) -> str:
        """Which loop the forward runs: ``"tokens"`` over a cached state, ``"blocks"`` from zeros (a prompt)."""
        return per_call(self, "kernel", lambda: "tokens" if self.entering_state() is not None else "blocks")

    def decoding(self) -> bool:
        """Whether the call continues a cached state, token by token (a decode step, or a prompt over a cache)."""
        return self.kernel_call() == "tokens"

    def entering_state(self) -> torch.Tensor | None:
        """The state the cache held for this block as the call started, or ``None`` from zeros."""
        self.forward_call()
        return self._peek("entering_state")

    def call_length(self) -> int:
        """This call's tokens: the mixer's input length."""
        return self.forward_call()[0]

    def segmented(self) -> bool:
        return False

    def spans_calls(self, value: Any) -> bool:
        return False

    def calls_per_forward(self) -> int:
        return 1

    def call_arguments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries, keys and values of this call as the forward split them, read once per call."""
        self.kernel_call()

        def read() -> tuple[torch.Tensor, ...]:
            split = resolve(self, f"source.{self._label('split')}.output")[0].output
            # the block and token loops' bindings come after the split: count what earlier calls put through them
            mediator = Mediator.current("loops")
            loop = "token_state" if self.decoding() else "block_state"
            replace_per_call(
                self,
                "loop",
                {
                    name: mediator.occurrence(f"{self.path}.source.{self._label(name)}.output")
                    for name in (loop, "block_output")
                },
            )
            return tuple(split)

        return per_call(self, "arguments", read)

    def replaced(self, location: str, value: Any) -> None:
        """An assignment to the split replaces the recorded queries, keys and values."""
        if location == f"{self.path}.source.{self._label('split')}.output":
            replace_per_call(self, "arguments", tuple(value))

    def slopes(self) -> torch.Tensor:
        """Each head's rate ``s``, [heads]: the state keeps ``exp(-s)`` of itself per token."""
        return self._module.slope_rate.reshape(-1)

    # -- the values ---------------------------------------------------------------------

    def _split_key(self) -> str:
        return f"source.{self._label('split')}.output"

    @EProperty(_split_key, unavailable=needs_kernel_call, select=0)
    def attention_queries(self, value: Any) -> LinearQK:
        """q, what each token reads the state with, [batch, seq, heads, head_dim]: ``act(qkv_proj(x))``'s first third.

        A view of the forward's split, zero at padding. Assign it, or edit in
        place under ``torch.no_grad()``.
        """
        return value

    @EProperty(_split_key, unavailable=needs_kernel_call, select=1)
    def attention_keys(self, value: Any) -> LinearQK:
        """k, where each token writes into the state, [batch, seq, heads, head_dim].

        Assign it, or edit in place under ``torch.no_grad()``.
        """
        return value

    @EProperty(_split_key, unavailable=needs_kernel_call, select=2)
    def attention_values(self, value: Any) -> LinearV:
        """v, what each token writes, [batch, seq, heads, head_dim].

        Assign it, or edit in place under ``torch.no_grad()``.
        """
        return value

    def _decays(self) -> Gates:
        """The log of what the state keeps per token, ``-slope_rate``, [batch, seq, heads]; derived, read-only.

        A constant per head and layer in MiniMax, the same at every token.
        """
        batch, _, _ = self.call_arguments()[0].shape[:3]
        return (-self.slopes()).expand(batch, self.call_length(), -1)

    decays = DerivedEProperty(_decays, unavailable=needs_kernel_call)
    betas = unavailable(NO_BETAS)

    @EProperty(_split_key, unavailable=needs_kernel_call, select=0)
    def state_input(self, value: Any) -> State:
        """The state a call over a cache starts from, [batch, heads, head_dim, head_dim]: a copy; ``None`` on a prompt.

        Served at the split of the projection, with the queries: the forward
        reads the cache right after it. Assigning it replaces the cache's
        state, which the call then continues; a prompt from an empty cache has
        none, and a write there raises.
        """
        entering = self.entering_state()
        return None if entering is None else entering.clone()

    @state_input.postprocess
    def state_input(self, value: torch.Tensor) -> torch.Tensor:
        _, cache = self.forward_call()
        entering = self.entering_state()
        if entering is None:
            raise ValueError(NOT_ON_A_PROMPT.format(path=standard_path(self)))
        written = value.to(entering).detach().clone()
        cache.set_linear_cache(self._module.layer_idx, written)
        replace_per_call(self, "entering_state", written)
        # the split itself is left as it was: the write goes to the cache the forward reads next
        return self.call_arguments()[0]

    def _norm_key(self) -> str:
        self.call_arguments()
        return f"source.{self._label('norm')}.input"

    @EProperty(_norm_key, unavailable=needs_kernel_call)
    def attention_head_outputs(self, value: Any) -> LinearHeadOutputs:
        """o_t = q_t S_t, each head's read of the state, [batch, seq, heads, head_dim], before the norm and the gate.

        The output norm's input, viewed per head. Assign, or edit in place.
        """
        return value.unflatten(-1, (self.mixer_heads, self.value_dim))

    @attention_head_outputs.postprocess
    def attention_head_outputs(self, value: torch.Tensor) -> torch.Tensor:
        return value.flatten(-2)

    def _gate_key(self) -> str:
        self.call_arguments()
        return f"source.{self._label('gate')}.output"

    @EProperty(_gate_key, unavailable=needs_kernel_call)
    def output_gates(self, value: Any) -> LinearHeadOutputs:
        """sigmoid(output_gate(x)), what multiplies the normed head outputs, [batch, seq, heads, head_dim].

        Assign, or edit in place.
        """
        return value.unflatten(-1, (self.mixer_heads, self.value_dim))

    @output_gates.postprocess
    def output_gates(self, value: torch.Tensor) -> torch.Tensor:
        return value.flatten(-2)

    def _state_output_key(self) -> str:
        self.call_arguments()
        if self.forward_call()[1] is None:
            raise Unavailable(f"state_output on {standard_path(self)}: {NO_CACHE}")
        return f"source.{self._label('cache_write')}.inputs"

    @EProperty(_state_output_key, unavailable=needs_kernel_call, select=1)
    def state_output(self, value: Any) -> State:
        """The state after the call's last token, [batch, heads, head_dim, head_dim], as the cache receives it (a copy).

        Assigning it, or editing it in place, changes what the next call
        starts from, not this call's outputs.
        """
        return self.serve_state(value, _same)

    @state_output.transform
    def state_output(self, view: torch.Tensor, element: Any) -> Any:
        return self.write_back_state(view, element)

    # -- the state after every token ------------------------------------------------------

    state = unavailable(NO_STATE_PLACE)

    def _states(self) -> States:
        """The state after every token of this call, [batch, seq, heads, head_dim, head_dim], computed exactly.

        From the call's queries, keys, values and slopes, as
        ``state_trajectory``; after ``set_state_after`` in the same call it
        raises, the write being in none of them.
        """
        return self._recomputed("states", None)

    states = DerivedEProperty(_states, unavailable=needs_kernel_call)

    def _state_trajectory(self) -> States:
        """The state after every token of this call, [batch, seq, heads, head_dim, head_dim], from its queries, keys, values."""
        return self.trajectory()

    state_trajectory = DerivedEProperty(_state_trajectory, unavailable=needs_kernel_call)

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> States:
        """The states after ``positions`` (``lightning_states``), in ``dtype`` or the values' dtype.

        They record no gradient (``trajectory``), so they go into the memory this mixer's last ones took, once
        nothing refers to those (:func:`nnterp.components.states_memory.reusable_states`).
        """
        _, keys, values = self.call_arguments()
        chosen, order, single = select_positions(positions, keys.shape[1])
        wanted = dtype or values.dtype
        # the recurrence is computed in float32 at least: bfloat16 chunk sums would drift
        work = torch.promote_types(wanted, torch.float32)
        memory = functools.partial(reusable_states, self._module, keys.new_empty(0, dtype=work))
        states = lightning_states(keys, values, self.slopes(), self.entering_state(), chosen, work, memory)
        states = states.to(wanted)
        if order is not None:
            states = states[:, order]
        return states[:, 0] if single else states

    def state_after(self, t: int) -> State:
        """The state after token ``t`` of this call, [batch, heads, head_dim, head_dim], computed exactly."""
        return self._recomputed(f"state_after({t})", self._position("state_after", t))

    def set_state_after(self, t: int, value: torch.Tensor) -> None:
        """Make the state after token ``t`` be ``value``: token ``t``'s output and every later one read it.

        Over a cached state the forward binds the state after each token, and
        the write is put there. On a prompt, which binds the state only at
        block ends, the recurrence is linear in the state: the change ``D =
        value - S_t`` adds ``exp(-s (i - t)) q_i D`` to the outputs of the
        block's tokens ``i >= t``, and ``exp(-s (end - t)) D`` to the state the
        block hands on, from which the forward carries it to later blocks and
        the cache. Write before reading ``attention_head_outputs`` or any later
        value of the call, and in increasing blocks: a block already written
        or passed raises :class:`OrderError`.
        """
        position = self._position("set_state_after", t)
        where = f"set_state_after({t}) on {standard_path(self)}"
        furthest = self._peek("furthest")
        if self._returned() or (furthest is not None and furthest.stage > self._stage("states")):
            raise OrderError(
                f"{where}: the forward has passed token {t}; write the state before reading "
                f"attention_head_outputs or any later value of this call ({self.order_hint('set_state_after')})"
            )
        current = self._effective_state(position)
        if tuple(value.shape) != tuple(current.shape):
            raise ValueError(
                f"{where}: the state is [batch, heads, head_dim, head_dim] = {list(current.shape)}, "
                f"got {list(value.shape)}"
            )
        loop = self._peek("loop")
        if self.decoding():
            self._write_token_state(where, loop["token_state"], position, value)
        else:
            self._write_block(where, loop, position, value - current)
        self.record_order("states", written=True)

    def _effective_state(self, position: int) -> torch.Tensor:
        """The state after ``position`` with this call's earlier writes, which the recorded arguments miss."""
        state = self.trajectory(positions=position, dtype=torch.float32)
        slopes = self.slopes().float()
        for written, change in self._peek("writes") or ():
            state = state + decay_powers(slopes, torch.tensor(position - written))[None, :, None, None] * change
        return state

    def _write_token_state(self, where: str, first: int, position: int, value: torch.Tensor) -> None:
        last = self._peek("written position")
        if last is not None and position <= last:
            raise OrderError(f"{where}: the token loop has passed token {position}; write tokens in increasing order")
        operation = self._operation("token_state")
        with pinned(first + position):
            current = operation.output
            operation.output = value.to(current)
        replace_per_call(self, "written position", position)

    def _write_block(self, where: str, loop: dict[str, int], position: int, change: torch.Tensor) -> None:
        size = self._module.block_size
        block = position // size
        last = self._peek("written block")
        if last is not None and block <= last:
            raise OrderError(
                f"{where}: block {block} (tokens {block * size}..{block * size + size - 1}) was already written or "
                f"passed by this call's block loop; write one state per block, in increasing blocks"
            )
        start, stop = block * size, min(block * size + size, self.call_length())
        queries = self.call_arguments()[0][:, start:stop].float()
        slopes = self.slopes().float()
        index = torch.arange(start, stop)
        # [batch, block, heads, head_dim]: what each of the block's outputs reads of the change
        effect = lightning_readout(queries, change, slopes, index - position)
        outputs = self._operation("block_output")
        with pinned(loop["block_output"] + block):
            current = outputs.output
            outputs.output = current + effect.transpose(1, 2).to(current)
        handed = self._operation("block_state")
        with pinned(loop["block_state"] + block):
            current = handed.output
            decay = decay_powers(slopes, torch.tensor(stop - 1 - position))
            handed.output = current + (decay[None, :, None, None] * change).to(current)
        replace_per_call(self, "written block", block)
        replace_per_call(self, "writes", (*(self._peek("writes") or ()), (position, change)))

    # -- token mixing ----------------------------------------------------------------------

    def token_mixing(self, positions: Positions = None, heads: Heads = None) -> Mixing:
        """The exact token mixing per head, [batch, heads, rows, seq]: ``M[t, j] = exp(-s (t - j)) q_t . k_j``, j <= t.

        ``mixed(M, attention_values) + mixing_offset() == attention_head_outputs``;
        the offset is the readout of the cached state a call over a cache
        starts from, zero on a prompt.
        """
        return super().token_mixing(positions, heads)

    def _rows_of_call(self, what: str, positions: Positions) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        inside_trace(self, f"{what}()")
        reason = needs_kernel_call(self)
        if reason is not None:
            raise Unavailable(f"{what} on {standard_path(self)}: {reason}")
        return select_positions(positions, self.call_length())

    def mixing_from_arguments(self, rows: torch.Tensor, heads: torch.Tensor) -> TokenMixing:
        """The token mixing at ``rows`` and ``heads`` (``lightning_mixing``), float32."""
        queries, keys, _ = self.call_arguments()
        return TokenMixing(
            *lightning_mixing(queries, keys, self.slopes(), self.entering_state(), rows, heads, self.value_dim)
        )

    def readout_from_arguments(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``q_t S`` at ``rows`` with ``state`` as ``S``: each row's query reading it, undecayed."""
        queries = self.call_arguments()[0][:, rows.to(self.call_arguments()[0].device)]
        zero = torch.zeros(len(rows), dtype=torch.long)
        return lightning_readout(queries, state, self.slopes(), zero)


def _same(state: torch.Tensor) -> torch.Tensor:
    """The cache's state is laid out [batch, heads, key_dim, value_dim], the standard layout."""
    return state
