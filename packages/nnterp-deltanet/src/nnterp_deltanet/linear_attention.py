"""LinearAttention: a gated DeltaNet mixer, read at its delta-rule kernel call."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from nnterp import DerivedEProperty, EProperty
from nnterp.components.kernels import kernel, needs_kernel_call, needs_torch_kernels
from nnterp.components.recurrent import RETURNED_TOGETHER, RecurrentMixer
from nnterp.components.routing import route_kernels
from nnterp.layouts import ChannelGates, Gates, LinearHeadOutputs, LinearQK, LinearV, State, States
from nnterp.positions import Positions

from .trajectory import delta_rule_states

#: route_delta_rule's modes and the route_kernels modes they are.
DELTA_RULE_MODES = {"recurrent": "torch", "chunked": "default"}


def _widened(arguments: tuple[tuple, dict]) -> tuple[tuple, dict]:
    """The kernel's arguments with queries and keys repeated up to the value heads.

    From transformers 5.23 the forward hands the kernel queries and keys with
    ``num_k_heads`` heads and the kernel repeats them; before, the forward
    repeats them itself. Handing the kernel repeated ones makes it skip its
    own repeat and compute the same thing, so an edit of the repeated
    queries or keys is what the kernel reads on every version.
    """
    args, kwargs = arguments
    query, key, value = args[:3]
    groups = value.shape[2] // query.shape[2]
    if groups == 1:
        return arguments
    repeated = (query.repeat_interleave(groups, dim=2), key.repeat_interleave(groups, dim=2))
    return (*repeated, *args[2:]), kwargs


def _with_argument(arguments: tuple[tuple, dict], position: int, tensor: torch.Tensor) -> tuple[tuple, dict]:
    args, kwargs = _widened(arguments)
    return (*args[:position], tensor, *args[position + 1 :]), kwargs


class LinearAttention(RecurrentMixer):
    """A gated DeltaNet mixer (Qwen3-Next, Qwen3.5, OLMo-Hybrid; Kimi-Linear's KDA subclasses it).

    Linear attention with a recurrent state: one ``[key_dim, value_dim]``
    matrix per head. Each token decays the state by its gate (``decays``),
    writes its key/value pair in with strength ``betas`` (the delta rule
    replaces what the key already retrieves), and its query reads the
    result. So the shared names mean what they mean on softmax attention
    (the contribution, the queries/keys/values the mixer receives, each
    head's output), and there is no pattern; instead there are the gate,
    the beta and the state entering and leaving the layer.

    Everything but ``attention_output`` is read at the delta-rule kernel call:
    transformers' chunked rule on a prompt, its token-by-token rule on a
    decode step (``RecurrentMixer.KERNEL``). ``heads`` is the mixer's value
    heads: queries and keys are served repeated up to it on every
    transformers version. The state after every token needs
    ``nnterp.route_kernels(model.family, "torch")`` (or
    ``route_delta_rule(model.family, "recurrent")``) before the first trace.
    """

    CHUNK_KERNEL = "torch_chunk_gated_delta_rule_0"
    RECURRENT_KERNEL = "torch_recurrent_gated_delta_rule_0"
    STATE_OP = "last_recurrent_state_3"
    STARTING_STATE = ("initial_state", "initial_state")
    # both kernels return (head outputs, final state)
    ORDER = RETURNED_TOGETHER
    KIND = "gated DeltaNet"

    # -- sizes ---------------------------------------------------------------------

    @property
    def mixer_heads(self) -> int:
        """Heads of the state: the mixer's value heads (queries and keys are repeated up to them)."""
        return self._module.num_v_heads

    @property
    def key_dim(self) -> int:
        """Width of one head's queries and keys: the state's rows."""
        return self._module.head_k_dim

    @property
    def value_dim(self) -> int:
        """Width of one head's values and outputs: the state's columns."""
        return self._module.head_v_dim

    # -- values at the kernel call ----------------------------------------------

    def _assign_argument(self, position: int, tensor: torch.Tensor) -> tuple[tuple, dict]:
        return _with_argument(getattr(self.source, type(self).KERNEL(self)).inputs, position, tensor)

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels)
    def attention_queries(self, arguments: Any) -> LinearQK:
        """The queries the delta rule receives, [batch, seq, heads, key_dim].

        After the convolution and activation, repeated to the value heads, and
        before the kernel's l2-norm and 1/sqrt(key_dim) scale. Assign, or edit
        in place.
        """
        return _widened(arguments)[0][0]

    @attention_queries.postprocess
    def attention_queries(self, tensor: torch.Tensor) -> tuple[tuple, dict]:
        return self._assign_argument(0, tensor)

    @attention_queries.transform
    def attention_queries(self, view: torch.Tensor, arguments: Any) -> tuple[tuple, dict]:
        return _with_argument(arguments, 0, view)

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels)
    def attention_keys(self, arguments: Any) -> LinearQK:
        """The keys the delta rule receives, [batch, seq, heads, key_dim], repeated to the value heads.

        Before the kernel's l2-norm. Assign, or edit in place.
        """
        return _widened(arguments)[0][1]

    @attention_keys.postprocess
    def attention_keys(self, tensor: torch.Tensor) -> tuple[tuple, dict]:
        return self._assign_argument(1, tensor)

    @attention_keys.transform
    def attention_keys(self, view: torch.Tensor, arguments: Any) -> tuple[tuple, dict]:
        return _with_argument(arguments, 1, view)

    @EProperty(kernel("inputs"), select=2, unavailable=needs_torch_kernels)
    def attention_values(self, value: Any) -> LinearV:
        """The values the delta rule receives, [batch, seq, heads, value_dim]. Assign, or edit in place."""
        return value

    @EProperty(kernel("inputs"), select="g", unavailable=needs_torch_kernels)
    def decays(self, value: Any) -> Gates:
        """The gate: the log of how much of the state each token keeps, [batch, seq, heads], float32, non-positive.

        Assign, or edit in place.
        """
        return value

    @EProperty(kernel("inputs"), select="beta", unavailable=needs_torch_kernels)
    def betas(self, value: Any) -> Gates:
        """How strongly each token's key/value pair is written into the state, [batch, seq, heads].

        In (0, 1); in (0, 2) on OLMo-Hybrid with ``linear_allow_neg_eigval``.
        Assign, or edit in place.
        """
        return value

    @EProperty(kernel("inputs"), select="initial_state", unavailable=needs_torch_kernels)
    def state_input(self, value: Any) -> State | None:
        """The state this call starts from, [batch, heads, key_dim, value_dim]: ``None`` on a fresh prompt.

        Over a cached state, a copy of it: the cache overwrites its buffer
        with the call's final state, so the live tensor would read as this
        call's output by the end of the trace. Assign to replace what the call
        starts from.
        """
        return None if value is None else value.clone()

    @EProperty(kernel("output"), select=0, unavailable=needs_torch_kernels)
    def attention_head_outputs(self, value: Any) -> LinearHeadOutputs:
        """Each head's read of the state, [batch, seq, heads, value_dim], before the gated norm and the output projection.

        Assign, or edit in place.
        """
        return value

    @EProperty(kernel("output"), select=1, unavailable=needs_torch_kernels)
    def state_output(self, value: Any) -> State:
        """The state after the call's last token, [batch, heads, key_dim, value_dim]: what the next decode step starts from.

        Assigning it changes what the cache receives, not this call's output.
        """
        return value

    # -- the state after every token, from the call's arguments ------------------------

    def trajectory(self, positions: Positions = None, dtype: torch.dtype | None = None) -> States:
        """The state after chosen tokens of this call, [batch, positions, heads, key_dim, value_dim], computed from its arguments.

        ``state_trajectory`` with a selection: ``positions`` indexes the
        call's tokens as ``states[:, positions]`` would (an int, a slice, a
        list; an int drops the axis) and only those states are computed. The
        call's queries, keys, values, gates, betas and starting state are read
        at the kernel call and the states computed beside it in pure torch
        (``delta_rule_states``), so it needs no routing and works with an
        optimized kernel installed. The dtype is the kernel's (its queries')
        unless ``dtype`` says otherwise.

        It reads only the call's arguments, as assigned (an assigned
        ``attention_keys`` or ``state_input`` is in it), so it can be read
        before or after the call's other values; a call over a cached state
        starts from a copy of it taken before the cache overwrites it. No
        gradient flows through it: the computation writes into its result in
        place, which autograd refuses.
        """
        args, kwargs = self.call_arguments()
        # the forwards pass query, key and value by position and the rest by keyword
        named = dict(zip(("query", "key", "value", "g", "beta"), args, strict=False))
        named.update(kwargs)
        with torch.no_grad():
            return delta_rule_states(
                named["query"],
                named["key"],
                named["value"],
                named["g"],
                named["beta"],
                self.entering_state(),
                positions=positions,
                use_qk_l2norm=named.get("use_qk_l2norm_in_kernel", False),
                dtype=dtype,
            )

    def _state_trajectory(self) -> States:
        """The state after every token of this call, [batch, seq, heads, key_dim, value_dim], from the kernel call's arguments; no routing needed."""
        return self.trajectory()

    state_trajectory = DerivedEProperty(_state_trajectory, unavailable=needs_kernel_call)


class KimiDeltaAttention(LinearAttention):
    """Kimi-Linear's delta attention (KDA): a gated DeltaNet whose gate is one decay per key channel.

    ``decays`` is ``[batch, seq, heads, key_dim]``: each row of a head's state
    decays at its own rate. Queries, keys and values share one head count.
    transformers keeps it at ``self_attn``; the family standardizes it to
    ``linear_attn``.
    """

    CHUNK_KERNEL = "chunk_kimi_delta_attention_0"
    RECURRENT_KERNEL = "recurrent_kimi_delta_attention_0"
    STATE_OP = "last_recurrent_state_2"

    @property
    def mixer_heads(self) -> int:
        """Heads of the state."""
        return self._module.num_heads

    @property
    def key_dim(self) -> int:
        """Width of one head's queries and keys: the state's rows."""
        return self._module.head_dim

    @property
    def value_dim(self) -> int:
        """Width of one head's values and outputs: the state's columns."""
        return self._module.head_dim

    @EProperty(kernel("inputs"), select="g", unavailable=needs_torch_kernels)
    def decays(self, value: Any) -> ChannelGates:
        """The gate, one per key channel: the log of how much of each state row a token keeps, [batch, seq, heads, key_dim].

        float32 and non-positive. Assign, or edit in place.
        """
        return value


def route_delta_rule(family: ModuleType, mode: str) -> None:
    """``route_kernels`` for a gated DeltaNet, in its own words.

    ``"recurrent"`` is ``route_kernels(family, "torch")``: the family's prompts
    run through transformers' token-by-token gated delta rule, which
    materializes the state after every token. ``"chunked"`` is
    ``route_kernels(family, "default")``.

    Raises:
        ValueError: a mode other than ``"recurrent"`` or ``"chunked"``.
    """
    if mode not in DELTA_RULE_MODES:
        raise ValueError(f"route_delta_rule mode must be 'recurrent' or 'chunked', not {mode!r}")
    route_kernels(family, DELTA_RULE_MODES[mode])
