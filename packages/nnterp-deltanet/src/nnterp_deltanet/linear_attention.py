"""LinearAttention: a gated DeltaNet mixer, read at its delta-rule kernel call."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from nnterp import EProperty
from nnterp.analysis import TokenMixing
from nnterp.components.call_order import RETURNED_TOGETHER
from nnterp.components.call_site import ArgumentOf, argument, kernel, needs_torch_kernels
from nnterp.components.declaration import ENTERING_STATE, KernelCall
from nnterp.components.per_token import TOKEN_LOOP
from nnterp.components.recurrent import RecurrentMixer
from nnterp.components.routing import route_kernels
from nnterp.forward_source import Binding
from nnterp.layouts import ChannelGates, Gates, LinearHeadOutputs, LinearQK, LinearV, State, States
from nnterp.positions import Positions
from nnterp.value_paths import ArgumentSelection, BoundArgument

from .gradients import DeltaRuleRun, delta_rule_state_gradients, delta_rule_state_patch_estimates
from .mixing import delta_rule_mixing, delta_rule_readout
from .trajectory import delta_rule_states

#: Inside the token-by-token rule: the state after each token, the last binding in its loop over tokens.
TOKEN_STATE = Binding("last_recurrent_state", loop=True)
#: route_delta_rule's modes and the route_kernels modes they are.
DELTA_RULE_MODES = {"recurrent": "torch", "chunked": "default"}


@dataclass(frozen=True)
class Widened(ArgumentSelection):
    """The queries or the keys of a delta-rule call, repeated up to the value heads; placed back with both repeated.

    From transformers 5.23 the forward hands the kernel queries and keys with
    ``num_k_heads`` heads and the kernel repeats both when the keys have fewer
    heads than the values; before, the forward repeats them itself. Handing
    the kernel both repeated makes it skip its own repeat and compute the same
    thing, so an edit of the repeated queries or keys is what the kernel reads
    on every version.
    """

    argument: BoundArgument
    other: BoundArgument
    heads: int  #: the value heads

    def widen(self, arguments: tuple[tuple, dict]) -> tuple[tuple, dict]:
        groups = self.heads // self.argument.pick(arguments).shape[2]
        for parameter in (self.argument, self.other) if groups > 1 else ():
            arguments = parameter.place(arguments, parameter.pick(arguments).repeat_interleave(groups, dim=2))
        return arguments

    def pick(self, arguments: tuple[tuple, dict]) -> torch.Tensor:
        return self.argument.pick(self.widen(arguments))

    def place(self, arguments: tuple[tuple, dict], value: Any) -> tuple[tuple, dict]:
        return self.argument.place(self.widen(arguments), value)


@dataclass(frozen=True)
class WidenedArgument(ArgumentOf):
    """The ``select`` of the queries (``"query"``) or keys (``"key"``), repeated up to the value heads."""

    def __call__(self, envoy: "LinearAttention") -> Widened:
        other = {"query": "key", "key": "query"}[self.name]
        return Widened(envoy.kernel_call_argument(self.name), envoy.kernel_call_argument(other), envoy.mixer_heads)


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
    decode step (``RecurrentMixer.kernel_call``). ``heads`` is the mixer's value
    heads: queries and keys are served repeated up to it on every
    transformers version. The state after every token needs
    ``nnterp.route_kernels(model.family, "torch")`` (or
    ``route_delta_rule(model.family, "recurrent")``) before the first trace.
    """

    # routed, a prompt runs the decode step's token loop, whose body binds the state after each token
    PROMPT = KernelCall("torch_chunk_gated_delta_rule", "initial_state", TOKEN_STATE)
    DECODE = KernelCall("torch_recurrent_gated_delta_rule", "initial_state", TOKEN_STATE)
    PER_TOKEN = TOKEN_LOOP
    # both kernels return (head outputs, final state)
    ORDER = RETURNED_TOGETHER
    TOKEN_AXES = {"query": 1, "key": 1, "value": 1, "g": 1, "beta": 1}
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

    @EProperty(kernel("inputs"), select=WidenedArgument("query"), unavailable=needs_torch_kernels)
    def attention_queries(self, value: Any) -> LinearQK:
        """The queries the delta rule receives, [batch, seq, heads, key_dim].

        After the convolution and activation, repeated to the value heads, and
        before the kernel's l2-norm and 1/sqrt(key_dim) scale. Assign, or edit
        in place.
        """
        return value

    @attention_queries.transform
    def attention_queries(self, view: torch.Tensor, element: Any) -> torch.Tensor:
        return view

    @EProperty(kernel("inputs"), select=WidenedArgument("key"), unavailable=needs_torch_kernels)
    def attention_keys(self, value: Any) -> LinearQK:
        """The keys the delta rule receives, [batch, seq, heads, key_dim], repeated to the value heads.

        Before the kernel's l2-norm. Assign, or edit in place.
        """
        return value

    @attention_keys.transform
    def attention_keys(self, view: torch.Tensor, element: Any) -> torch.Tensor:
        return view

    @EProperty(kernel("inputs"), select=argument("value"), unavailable=needs_torch_kernels)
    def attention_values(self, value: Any) -> LinearV:
        """The values the delta rule receives, [batch, seq, heads, value_dim]. Assign, or edit in place."""
        return value

    @EProperty(kernel("inputs"), select=argument("g"), unavailable=needs_torch_kernels)
    def decays(self, value: Any) -> Gates:
        """The gate: the log of how much of the state each token keeps, [batch, seq, heads], float32, non-positive.

        Assign, or edit in place.
        """
        return value

    @EProperty(kernel("inputs"), select=argument("beta"), unavailable=needs_torch_kernels)
    def betas(self, value: Any) -> Gates:
        """How strongly each token's key/value pair is written into the state, [batch, seq, heads].

        In (0, 1); in (0, 2) on OLMo-Hybrid with ``linear_allow_neg_eigval``.
        Assign, or edit in place.
        """
        return value

    @EProperty(kernel("inputs"), select=argument(ENTERING_STATE), unavailable=needs_torch_kernels)
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

    def _delta_rule_arguments(self) -> tuple[torch.Tensor | None, ...]:
        """The call's query, key, value, g, beta and the state it started from: what the delta rule's math takes."""
        return (*(self.argument(name) for name in ("query", "key", "value", "g", "beta")), self.entering_state())

    def _l2_norms(self) -> bool:
        """Whether the kernel l2-normalizes the queries and keys (``use_qk_l2norm_in_kernel``)."""
        return bool(self.argument("use_qk_l2norm_in_kernel"))

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> States:
        """The delta rule's states after ``positions`` of this call (``delta_rule_states``); dtype the queries'."""
        return delta_rule_states(
            *self._delta_rule_arguments(), positions=positions, use_qk_l2norm=self._l2_norms(), dtype=dtype
        )

    def state_gradient_inputs(self) -> tuple[torch.Tensor, ...]:
        """The call's query, key, g and beta, and whether the kernel l2-normalizes them (a bool tensor)."""
        query, key, _, g, beta, _ = self._delta_rule_arguments()
        return query, key, g, beta, torch.tensor(self._l2_norms())

    @classmethod
    def state_gradients(cls, inputs: tuple[torch.Tensor, ...], head_output_gradients: torch.Tensor) -> States:
        """The delta rule's adjoint (``delta_rule_state_gradients``) from ``state_gradient_inputs``."""
        *arguments, l2_norms = inputs
        return delta_rule_state_gradients(*arguments, head_output_gradients, use_qk_l2norm=bool(l2_norms))

    def state_patch_inputs(self) -> tuple[torch.Tensor, ...]:
        """The call's arguments and entering state (``gradients.DeltaRuleRun``), detached, and whether the kernel
        l2-normalizes the queries and keys (a bool tensor).

        Detached one by one: a ``torch.no_grad()`` block here would hold while
        the forward runs on to the arguments it waits for.
        """
        query, key, value, g, beta, entering = self._delta_rule_arguments()
        if entering is None:
            entering = torch.zeros(value.shape[0], value.shape[2], key.shape[-1], value.shape[-1], device=value.device)
        run = DeltaRuleRun(*(tensor.detach() for tensor in (query, key, value, g, beta, entering)))
        return (*run, torch.tensor(self._l2_norms()))

    @classmethod
    def state_patch_estimates(
        cls, clean: tuple[torch.Tensor, ...], corrupt: tuple[torch.Tensor, ...], head_output_gradients: torch.Tensor
    ) -> torch.Tensor:
        """The patch estimate in chunks (``gradients.delta_rule_state_patch_estimates``); on KDA a chunk of states at a time."""
        *clean_run, l2_norms = clean
        return delta_rule_state_patch_estimates(
            DeltaRuleRun(*clean_run),
            DeltaRuleRun(*corrupt[:-1]),
            head_output_gradients,
            use_qk_l2norm=bool(l2_norms),
        )

    def mixing_from_arguments(self, rows: torch.Tensor, heads: torch.Tensor) -> TokenMixing:
        """The delta rule's token mixing at ``rows`` and ``heads`` of this call (``delta_rule_mixing``)."""
        return delta_rule_mixing(*self._delta_rule_arguments(), rows, heads, use_qk_l2norm=self._l2_norms())

    def readout_from_arguments(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The scaled queries at ``rows`` reading ``state`` (``delta_rule_readout``)."""
        return delta_rule_readout(
            self.argument("query"),
            state,
            rows,
            use_qk_l2norm=self._l2_norms(),
        )


class KimiDeltaAttention(LinearAttention):
    """Kimi-Linear's delta attention (KDA): a gated DeltaNet whose gate is one decay per key channel.

    ``decays`` is ``[batch, seq, heads, key_dim]``: each row of a head's state
    decays at its own rate. Queries, keys and values share one head count.
    transformers keeps it at ``self_attn``; the family standardizes it to
    ``linear_attn``.
    """

    PROMPT = KernelCall("chunk_kimi_delta_attention", "initial_state", TOKEN_STATE)
    DECODE = KernelCall("recurrent_kimi_delta_attention", "initial_state", TOKEN_STATE)
    KIND = "KDA (Kimi delta attention)"

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

    @EProperty(kernel("inputs"), select=argument("g"), unavailable=needs_torch_kernels)
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
