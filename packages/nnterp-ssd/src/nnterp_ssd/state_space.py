"""StateSpace: a Mamba-2 (SSD) mixer, read at its scan kernel call; and chunk_per_token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from nnterp import EProperty, Unavailable, unavailable
from nnterp.analysis.mixing import TokenMixing
from nnterp.components.call_order import RETURNED_TOGETHER
from nnterp.components.call_site import argument, kernel, needs_torch_kernels
from nnterp.components.declaration import ENTERING_STATE, KernelCall
from nnterp.components.per_token import ChunkBoundaries
from nnterp.components.recurrent import RecurrentMixer
from nnterp.forward_source import Binding, Call
from nnterp.layouts import Gates, SSDHeadOutputs, SSDKeys, SSDQueries, SSDState, SSDStates, SSDValues
from nnterp.order import standard_path
from nnterp.positions import Positions
from nnterp.value_paths import resolve

from .gradients import ScanRun, ssd_state_gradients, ssd_state_patch_estimates
from .mixing import ssd_mixing, ssd_readout
from .trajectory import ssd_states, step_sizes

NO_STATE_OCCURRENCES = (
    "the chunk scan computes every token's state in one tensor per call, not one occurrence per token to walk "
    "with tracer.iter; read states, or state_after(t), after nnterp.chunk_per_token(model)"
)
NO_STATE_WRITES = (
    "the chunk scan computes every boundary state in one cumulative step from the initial state, so a state "
    "written at token t does not flow into later tokens' states; assign state_input to change where a call starts"
)

#: torch's softplus returns its input unchanged above this, so the inverse does too.
SOFTPLUS_THRESHOLD = 20.0
#: The scan's default dt_limit, and what the decode step's update applies: no clamp on a positive step.
NO_LIMIT = (0.0, float("inf"))


def needs_per_token_chunks(envoy: "StateSpace") -> str | None:
    """Why ``StateSpace.states`` is unavailable, or ``None``: no Python source, or chunks longer than a token.

    The chunk scan materializes the state only every ``chunk_size`` tokens
    (``ChunkBoundaries``).
    """
    return type(envoy).PER_TOKEN.reason(envoy)


def _inverse_softplus(value: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) == value, for value > 0 (float32)."""
    value = value.float()
    return torch.where(value > SOFTPLUS_THRESHOLD, value, value + torch.log(-torch.expm1(-value)))


def _transposed(state: torch.Tensor) -> torch.Tensor:
    """A state between the kernel's [..., head_dim, state_dim] and the standard [..., state_dim, head_dim] (a view)."""
    return state.transpose(-1, -2)


def _kernel_key(attribute: str) -> Callable[["StateSpace"], str]:
    def key(envoy: "StateSpace") -> str:
        return envoy._kernel_path(attribute)

    return key


class StateSpace(RecurrentMixer):
    """A Mamba-2 (SSD) mixer (Mamba-2, Nemotron-H, Bamba, Falcon-H1, Zamba2, GraniteMoeHybrid): a selective state space.

    SSD, the state-space dual, is linear attention with one scalar decay per
    head. Each head keeps a ``[state_dim, head_dim]`` state ``h``, and every
    token does::

        h = exp(dt * A) * h + dt * B x^T
        y = C^T h + D * x

    with ``dt = softplus(dt_raw + dt_bias)``. So the shared names mean what
    they mean on a gated DeltaNet:

    - ``attention_queries`` is ``C`` (what reads the state) and
      ``attention_keys`` is ``B`` (where a token writes into it), both
      ``[batch, seq, groups, state_dim]``: one per group of heads, shared by
      the ``mixer_heads // groups`` heads of the group.
    - ``attention_values`` is ``x``, what is written, ``[batch, seq, mixer_heads, head_dim]``.
    - ``betas`` is ``dt``, the write strength, and ``decays`` is
      ``A * dt``, the log of how much of the state a token keeps (float32,
      non-positive), both ``[batch, seq, mixer_heads]``. Both are the kernel's
      raw ``dt`` argument seen through ``dt_bias``, the softplus and ``A``;
      an assignment is carried back into that argument, so the kernel computes
      with the assigned gate.
    - ``state_input`` / ``state_output``: the state entering and leaving the
      call, ``[batch, mixer_heads, state_dim, head_dim]`` (the key side first,
      as on every mixer), the transpose of the cache's layout; an assignment
      is transposed back. ``state_input`` is ``None`` on a fresh prompt.
    - ``attention_head_outputs`` is ``y``, with the ``D`` skip, before the
      gated norm and ``out_proj``, ``[batch, seq, mixer_heads, head_dim]``.

    Everything but ``attention_output`` is read at the scan call: transformers'
    ``mamba2_chunk_scan`` on a prompt, its ``mamba2_selective_state_update``
    on a decode step (``RecurrentMixer.kernel_call``), each call's arguments found
    by its kernel's own signature. The update has no sequence axis: a decode
    step's values are served with a sequence axis of 1, removed again on
    assignment. The update writes the new state into the cache's buffer and
    returns only ``y`` (gated by ``z`` on Falcon-H1), so a decode step's
    ``state_output`` and ``attention_head_outputs`` are read inside it.

    The chunk scan materializes the state at every chunk boundary in one
    tensor (``ChunkBoundaries``). With a chunk size of 1
    (:func:`chunk_per_token`) every token is a boundary, and ``states`` /
    ``state_after(t)`` are the state after every token of the call. There is
    no per-token occurrence to walk with ``tracer.iter`` (``state`` is
    unavailable) and no per-token write (``set_state_after`` is unavailable):
    assign ``state_input`` to change where a call starts.

    A value that needs another argument of the call (``betas`` needs
    ``dt_bias``) reads the call's arguments once per call, at its first need.
    Read the values in the order the call makes them: the kernel's
    arguments, then ``states`` and ``state_output``, then
    ``attention_head_outputs`` (on a decode step the update computes the new
    state before ``y``).
    """

    # inside the chunk scan, the state at every chunk boundary [batch, chunks + 1, heads, head_dim, state_dim], and
    # its last, what it returns as the final state; inside the update, the new state as the cache's buffer receives
    # it, and y with the D skip before the optional z gate
    PROMPT = KernelCall(
        "mamba2_chunk_scan", "initial_states", Binding("new_states"), reads={"final_state": Binding("final_state")}
    )
    DECODE = KernelCall(
        "mamba2_selective_state_update",
        "state",
        Call("ssm_states.to", within="state.copy_"),
        reads={"head_outputs": Binding("out", under="D is not None")},
    )
    PER_TOKEN = ChunkBoundaries()
    # the scan's tensors are tokens-first; the update's have no tokens axis (and its dt is repeated over head_dim)
    TOKEN_AXES = {"hidden_states": 1, "dt": 1, "B": 1, "C": 1}
    # the scan returns (y, final state); a decode step's state is read on either side of y
    ORDER = RETURNED_TOGETHER
    KIND = "Mamba-2 (SSD)"

    # -- sizes ---------------------------------------------------------------------

    @property
    def mixer_heads(self) -> int:
        """Heads of the state (the mixer's, which on a hybrid are not its softmax attention's)."""
        return self._module.num_heads

    @property
    def head_dim(self) -> int:
        """Width of one head's values and outputs: the mixer's head_dim, which on a hybrid is not its softmax attention's."""
        return self._module.head_dim

    @property
    def state_dim(self) -> int:
        """Width of the queries and keys (C and B): the state's rows."""
        return self._module.ssm_state_size

    @property
    def groups(self) -> int:
        """Groups of heads sharing one C and one B (n_groups)."""
        return self._module.n_groups

    # -- the call --------------------------------------------------------------------

    def _kernel_path(self, attribute: str) -> str:
        """Where a value is served on this call: at the prompt's scan call, or inside the decode step's update."""
        if self.decoding():
            if attribute == "state" and self.reads_state_after_the_update():
                return f"{self.located().key}.output"
            if attribute == "output":
                return self.inside("head_outputs")
            return f"{self.kernel_body()}.{self.token_state_label()}.output"
        if attribute == "state" and not self._returns_state():
            return self.inside("final_state")
        return f"{self.located().key}.output"

    def _returns_state(self) -> bool:
        """Whether the prompt's scan returns its final state (it does when the model runs with a cache)."""
        return bool(self.argument("return_final_states"))

    def _state_selection(self) -> int | None:
        return 1 if not self.decoding() and self._returns_state() else None

    # -- layouts -----------------------------------------------------------------------

    def _tokens(self, value: torch.Tensor) -> torch.Tensor:
        """A kernel tensor with the sequence axis the decode step's update does not have (a view)."""
        return value.unsqueeze(1) if self.decoding() else value

    def _kernel_tensor(self, value: torch.Tensor) -> torch.Tensor:
        """An assigned tokens-first tensor in the kernel's layout: without the sequence axis on a decode step."""
        if self.decoding():
            if value.shape[1] != 1:
                raise ValueError(
                    f"a decode step has one token: assign a tensor with 1 on axis 1, not {tuple(value.shape)}"
                )
            return value.squeeze(1)
        return value

    def _gate_inputs(self) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float]]:
        """(dt_bias, A, dt_limit) per head as the kernel applies them to dt."""
        dt_bias, A = self.argument("dt_bias"), self.argument("A")
        if self.decoding():
            return dt_bias[..., 0], A[:, 0, 0], NO_LIMIT
        return dt_bias, A, self.argument("dt_limit")

    def _betas(self, dt: torch.Tensor) -> torch.Tensor:
        """The step size the kernel computes from its raw dt argument, tokens first."""
        dt_bias, _, (low, high) = self._gate_inputs()
        raw = dt[..., 0] if self.decoding() else dt
        betas = F.softplus(raw + dt_bias.to(raw.dtype)).clamp(low, high)
        return self._tokens(betas)

    def _dt_for(self, betas: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        """The raw dt argument for which the kernel computes ``betas``, in the kernel's layout."""
        dt_bias, _, _ = self._gate_inputs()
        raw = (_inverse_softplus(self._kernel_tensor(betas)) - dt_bias.float()).to(dt.dtype)
        return raw[..., None].expand_as(dt) if self.decoding() else raw

    # -- values at the kernel call -------------------------------------------------------

    @EProperty(kernel("inputs"), select=argument("C"), unavailable=needs_torch_kernels)
    def attention_queries(self, value: Any) -> SSDQueries:
        """C, what reads the state, [batch, seq, groups, state_dim].

        Assign to replace it. x, B and C are views of one split tensor, which
        torch lets you edit in place only without autograd (under
        ``torch.no_grad()``).
        """
        return self._tokens(value)

    @attention_queries.postprocess
    def attention_queries(self, value: torch.Tensor) -> torch.Tensor:
        return self._kernel_tensor(value)

    @EProperty(kernel("inputs"), select=argument("B"), unavailable=needs_torch_kernels)
    def attention_keys(self, value: Any) -> SSDKeys:
        """B, where each token writes into the state, [batch, seq, groups, state_dim].

        Assign to replace it (in place only under ``torch.no_grad()``, as for C).
        """
        return self._tokens(value)

    @attention_keys.postprocess
    def attention_keys(self, value: torch.Tensor) -> torch.Tensor:
        return self._kernel_tensor(value)

    @EProperty(kernel("inputs"), select=argument("hidden_states"), unavailable=needs_torch_kernels)
    def attention_values(self, value: Any) -> SSDValues:
        """x, what each token writes into the state, [batch, seq, mixer_heads, head_dim].

        After the convolution and activation: the scan's ``hidden_states``.
        Assign to replace it (in place only under ``torch.no_grad()``, as for C).
        """
        return self._tokens(value)

    @attention_values.postprocess
    def attention_values(self, value: torch.Tensor) -> torch.Tensor:
        return self._kernel_tensor(value)

    @EProperty(kernel("inputs"), select=argument("dt"), unavailable=needs_torch_kernels)
    def betas(self, dt: Any) -> Gates:
        """The step size dt = softplus(dt + dt_bias), how strongly each token writes, [batch, seq, mixer_heads].

        Computed from the kernel's raw dt argument, clamped to the mixer's
        time_step_limit on a prompt as the scan does. A copy: assign to
        change it, and the kernel's dt argument is set so that the kernel
        computes the assigned step size (which a prompt's scan clamps too).
        """
        return self._betas(dt)

    @betas.postprocess
    def betas(self, value: torch.Tensor) -> torch.Tensor:
        return self._dt_for(value, self.argument("dt"))

    @EProperty(kernel("inputs"), select=argument("dt"), unavailable=needs_torch_kernels)
    def decays(self, dt: Any) -> Gates:
        """A * dt, the log of how much of the state each token keeps, [batch, seq, mixer_heads], float32, non-positive.

        A copy: assign to change it, and the kernel's dt argument is set so
        that the kernel computes the assigned decay (A is the mixer's own,
        so the step size changes with it).
        """
        _, A, _ = self._gate_inputs()
        return A.float() * self._betas(dt).float()

    @decays.postprocess
    def decays(self, value: torch.Tensor) -> torch.Tensor:
        _, A, _ = self._gate_inputs()
        return self._dt_for(value / A.float(), self.argument("dt"))

    @EProperty(kernel("inputs"), select=argument(ENTERING_STATE), unavailable=needs_torch_kernels)
    def state_input(self, value: Any) -> SSDState | None:
        """The state this call starts from, [batch, mixer_heads, state_dim, head_dim]: ``None`` on a fresh prompt.

        A copy: on a decode step the kernel overwrites the cache's buffer with
        the step's new state, so the live tensor would read as this step's
        output by the end of the trace. Assign to change where the call
        starts; on a decode step the assigned state is copied into the
        cache's buffer, which the step then updates as usual.
        """
        return None if value is None else value.transpose(-1, -2).clone()

    @state_input.postprocess
    def state_input(self, value: torch.Tensor | None) -> torch.Tensor | None:
        if not self.decoding():
            return None if value is None else value.transpose(-1, -2)
        if value is None:
            raise ValueError("a decode step continues the cached state: assign a tensor to state_input, not None")
        buffer = self.argument(ENTERING_STATE)
        buffer.copy_(value.transpose(-1, -2))
        return buffer

    @EProperty(_kernel_key("output"), unavailable=needs_torch_kernels)
    def attention_head_outputs(self, value: Any) -> SSDHeadOutputs:
        """y, each head's read of the state plus the D skip, [batch, seq, mixer_heads, head_dim].

        Before the gated norm and the output projection (and, on a decode
        step, before any gate the update applies itself). Assign, or edit in
        place.
        """
        return self._tokens(value)

    @attention_head_outputs.postprocess
    def attention_head_outputs(self, value: torch.Tensor) -> torch.Tensor:
        return self._kernel_tensor(value)

    @EProperty(_kernel_key("state"), select=lambda envoy: envoy._state_selection(), unavailable=needs_torch_kernels)
    def state_output(self, value: Any) -> SSDState:
        """The state after the call's last token, [batch, mixer_heads, state_dim, head_dim]: what the next decode step starts from.

        What the cache receives: the scan's final state on a prompt. On a
        decode step a copy of the new state: inside the update, or, when
        ``attention_head_outputs`` was read first, of the cache's buffer once
        the update has returned. Assigning it, or editing it in place, changes
        what the next step starts from, not this call's output.
        """
        return self.read_state_output(value, _transposed)

    @state_output.postprocess
    def state_output(self, value: torch.Tensor) -> Any:
        return self.place_state_output(value, _transposed)

    @state_output.transform
    def state_output(self, view: torch.Tensor, element: Any) -> Any:
        return self.write_back_state(view, element)

    # -- the state after every token ------------------------------------------------------

    state = unavailable(NO_STATE_OCCURRENCES)

    def per_token_states(self) -> SSDStates:
        """Every token's state as the chunk scan binds it, at chunk boundaries one token apart (``chunk_per_token``)."""
        node, attribute = resolve(self, f"{self.kernel_body()}.{self.token_state_label()}.output")
        if self.decoding():
            return _transposed(getattr(node, attribute)).unsqueeze(1)
        return _transposed(getattr(node, attribute)[:, 1:])

    states = RecurrentMixer.states.laid_out(SSDStates)
    state_trajectory = RecurrentMixer.state_trajectory.laid_out(SSDStates)

    def as_prompt_argument(self, name: str, value: Any) -> Any:
        """A decode step's argument laid out as the chunk scan takes it (``_scan_argument``), where it carries tokens."""
        if not self.decoding() or name not in self.TOKEN_AXES or value is None:
            return value
        return self._tokens(value[..., 0] if name == "dt" else value)

    def _scan_argument(self, name: str) -> torch.Tensor:
        """The kernel's tokens-first argument ``name`` in the chunk scan's layout, on a decode step too.

        The update's tensors have no sequence axis, and its dt is repeated over head_dim.
        """
        value = self.argument(name)
        if not self.decoding():
            return value
        return self._tokens(value[..., 0] if name == "dt" else value)

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> SSDStates:
        """The scan's states after ``positions`` of this call (``ssd_states``), whatever the mixer's chunk size; dtype x's."""
        dt_bias, A, dt_limit = self._gate_inputs()
        x, dt, B = (self._scan_argument(name) for name in ("hidden_states", "dt", "B"))
        return ssd_states(
            x,
            dt,
            A,
            B,
            self.entering_state(),
            positions=positions,
            dt_bias=dt_bias,
            softplus=bool(self.argument("dt_softplus")),
            dt_limit=dt_limit,
            dtype=dtype,
        )

    def state_gradient_inputs(self) -> tuple[torch.Tensor, ...]:
        """The call's log decay ``dt A`` per token and head, and its ``C``: what ``state_gradients`` reads."""
        dt_bias, A, dt_limit = self._gate_inputs()
        dt, C = (self._scan_argument(name) for name in ("dt", "C"))
        return step_sizes(dt, dt_bias, bool(self.argument("dt_softplus")), dt_limit) * A.float(), C

    @classmethod
    def state_gradients(cls, inputs: tuple[torch.Tensor, ...], head_output_gradients: torch.Tensor) -> SSDStates:
        """The scan's adjoint (``ssd_state_gradients``) from ``state_gradient_inputs``."""
        return ssd_state_gradients(*inputs, head_output_gradients)

    def state_patch_inputs(self) -> tuple[torch.Tensor, ...]:
        """The call's log decays, B, C, writes ``dt x`` and entering state (``gradients.ScanRun``), float32, detached.

        Detached one by one: a ``torch.no_grad()`` block here would hold while
        the forward runs on to the arguments it waits for.
        """
        dt_bias, A, dt_limit = (value.detach() if torch.is_tensor(value) else value for value in self._gate_inputs())
        x, dt, B, C = (self._scan_argument(name).detach() for name in ("hidden_states", "dt", "B", "C"))
        step = step_sizes(dt, dt_bias, bool(self.argument("dt_softplus")), dt_limit)
        entering = self.entering_state()
        batch, _, heads, head_dim = x.shape
        entering = (
            torch.zeros(batch, heads, B.shape[-1], head_dim, device=x.device)
            if entering is None
            else entering.detach().transpose(-1, -2).float()
        )
        return ScanRun(step * A.float(), B.float(), C.float(), x.float() * step.unsqueeze(-1), entering)

    @classmethod
    def state_patch_estimates(
        cls, clean: tuple[torch.Tensor, ...], corrupt: tuple[torch.Tensor, ...], head_output_gradients: torch.Tensor
    ) -> torch.Tensor:
        """The patch estimate in chunks (``ssd_state_patch_estimates``), forming no state per token."""
        return ssd_state_patch_estimates(ScanRun(*clean), ScanRun(*corrupt), head_output_gradients)

    def mixing_from_arguments(self, rows: torch.Tensor, heads: torch.Tensor) -> TokenMixing:
        """The SSD matrix of this call at ``rows`` and ``heads`` and the rest of y (``ssd_mixing``), float32.

        The offset holds the readout of the entering state (the cached one on a decode step) and
        the D skip, both of which ``attention_head_outputs`` includes; a decode step's matrix is
        1x1.
        """
        dt_bias, A, dt_limit = self._gate_inputs()
        x, dt, B, C = (self._scan_argument(name) for name in ("hidden_states", "dt", "B", "C"))
        return ssd_mixing(
            x,
            dt,
            A,
            B,
            C,
            rows,
            heads,
            D=self._skip(),
            initial_state=self.entering_state(),
            dt_bias=dt_bias,
            softplus=bool(self.argument("dt_softplus")),
            dt_limit=dt_limit,
        )

    def readout_from_arguments(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``C_t^T h + D x_t`` at ``rows`` with ``state`` as ``h`` (``ssd_readout``), float32."""
        x, C = (self._scan_argument(name) for name in ("hidden_states", "C"))
        return ssd_readout(x, C, self._skip(), state, rows)

    def _skip(self) -> torch.Tensor | None:
        """D per head, as the kernel adds D x (the update's is repeated over head_dim); ``None`` without a skip."""
        D = self.argument("D")
        return D[..., 0] if D is not None and self.decoding() else D

    def state_after(self, t: int) -> SSDState:
        """The state after token ``t`` of this call, [batch, mixer_heads, state_dim, head_dim]: ``states[:, t]``."""
        states = self.states
        seq = states.shape[1]
        if not -seq <= t < seq:
            raise IndexError(
                f"state_after({t}) on {self.path}: this call has {seq} token(s), so t is in [{-seq}, {seq})"
            )
        return states[:, t]

    def set_state_after(self, t: int, value: torch.Tensor) -> None:
        """Unavailable on a Mamba-2 mixer: the chunk scan has no per-token state to write (``NO_STATE_WRITES``)."""
        raise Unavailable(f"set_state_after on {standard_path(self)}: {NO_STATE_WRITES}")


def chunk_per_token(model: Any, enabled: bool = True) -> None:
    """Run every Mamba-2 mixer of ``model`` with a chunk size of 1, so the chunk scan keeps the state after every token.

    The scan materializes the state at each chunk boundary
    (``StateSpace.states``); with ``chunk_size == 1`` every token is one. The
    outputs are the same up to float rounding; the cost is not: the recurrence
    between chunks is quadratic in the number of chunks, so a long prompt runs
    markedly slower (and on transformers 5.17, whose scan broadcasts instead of
    contracting, takes memory quadratic in its length).

    Unlike ``route_kernels``, which binds a family's kernels process-wide, this
    sets an attribute of each mixer module of this one model (``chunk_size``,
    which the forward reads on every call): it applies from the next trace,
    and to no other model. A model loaded by path holds meta modules that its
    first trace replaces with the real ones; ``enabled=True`` loads its
    weights first (``model.dispatch()``) so the setting lands on the modules
    that run.
    ``enabled=False`` restores the chunk size each mixer was built with (the
    config's ``chunk_size``; ``mamba_chunk_size`` on Bamba, Falcon-H1 and
    GraniteMoeHybrid).

    Raises:
        ValueError: the model has no Mamba-2 mixer.
    """
    mixers = model.modules(include_fn=lambda envoy: isinstance(envoy, StateSpace))
    if not mixers:
        raise ValueError(
            f"chunk_per_token: {type(model._module).__name__} has no Mamba-2 (StateSpace) mixer; it applies to "
            f"the families of nnterp-ssd (Mamba-2, Nemotron-H, Bamba, Falcon-H1, Zamba2, GraniteMoeHybrid)"
        )
    type(mixers[0]).PER_TOKEN.enable(model, enabled)
