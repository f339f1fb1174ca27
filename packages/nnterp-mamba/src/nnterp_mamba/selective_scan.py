"""SelectiveScan: a Mamba-1 mixer's values, read at the selective-scan kernel call its forward makes."""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F

from nnterp import AdjointRoute, DerivedEProperty, EProperty, RecurrentMixer, Unavailable, needs_torch_kernels
from nnterp.analysis.mixing import Heads, TokenMixing
from nnterp.components.call_order import RETURNED_TOGETHER
from nnterp.components.call_site import argument, kernel
from nnterp.components.declaration import ENTERING_STATE, KernelCall
from nnterp.components.per_token import ScanLoop
from nnterp.forward_source import Binding, Call
from nnterp.layouts import CHANNELS, ScanDecays, ScanMixing, ScanQK, ScanState, ScanStates, ScanSteps, ScanValues
from nnterp.order import standard_path
from nnterp.positions import Positions

from .gradients import (
    SelectiveScanAdjoint,
    SelectiveScanRun,
    selective_scan_state_gradients,
    selective_scan_state_patch_estimates,
)
from .mixing import selective_scan_mixing, selective_scan_readout
from .trajectory import (
    entering_contribution,
    gated,
    selective_scan_head_outputs,
    selective_scan_states,
    step_sizes,
)

NO_FINAL_STATE = (
    "this prompt ran without a cache (use_cache=False), so the scan returns no final state; trace with "
    "use_cache=True, or read states[:, -1] after nnterp.route_kernels(model.family, 'torch')"
)
NOT_ON_A_PROMPT = (
    "state_input on {path}: a prompt's scan starts from zeros and takes no state to replace; write the state "
    "after a token instead (set_state_after(t, value), or mix.state under tracer.iter[t])"
)


class SelectiveScanLoop(ScanLoop):
    """The scan's own token loop, unless mambapy runs in its place.

    With ``use_mambapy`` set on the mixer and mambapy installed, the
    pure-torch scan runs mambapy's parallel scan, which computes every state
    at once and never binds the state after a token.
    """

    def reason(self, envoy: "RecurrentMixer") -> str | None:
        reason = super().reason(envoy)
        if reason is not None:
            return reason
        module = envoy._module
        # The scan asks its own modeling module; one that never imported the check never takes mambapy's path.
        mambapy_installed = getattr(sys.modules[type(module).__module__], "is_mambapy_available", lambda: False)()
        if getattr(module, "use_mambapy", False) and mambapy_installed:
            return (
                "this mixer runs mambapy's parallel scan (use_mambapy=True and mambapy is installed), which computes "
                "every state at once and binds none per token; load the model with use_mambapy=False (or set "
                "use_mambapy = False on each mixer module) to run the token loop"
            )
        return None


def needs_token_loop(envoy: "SelectiveScan") -> str | None:
    """Why the state after each token is unavailable on a Mamba-1 mixer, or ``None`` (``SelectiveScanLoop``)."""
    return type(envoy).PER_TOKEN.reason(envoy)


def _same(state: torch.Tensor) -> torch.Tensor:
    """A Mamba-1 state's standard layout is the kernel's."""
    return state


def _tokens_first(value: torch.Tensor, decoding: bool) -> torch.Tensor:
    """A channel-first kernel tensor as a tokens-first view: [batch, n, seq] -> [batch, seq, n]; a decode step's [batch, n] -> [batch, 1, n]."""
    return value.unsqueeze(1) if decoding else value.transpose(1, 2)


def _channel_first(value: torch.Tensor, decoding: bool) -> torch.Tensor:
    """The inverse of ``_tokens_first``: what the kernel takes in place of an assigned tokens-first tensor."""
    return value[:, 0] if decoding else value.transpose(1, 2)


class SelectiveScan(RecurrentMixer):
    """A Mamba-1 mixer (Mamba, Falcon-Mamba, Jamba's Mamba blocks): a selective state-space scan.

    Every channel of the mixer's inner width (``channels``) keeps a state of
    ``state_dim`` numbers. Per token t, with a step size ``dt_t`` per channel
    and two vectors ``B_t`` and ``C_t`` of ``state_dim`` numbers shared by
    every channel::

        h_t = exp(dt_t * A) * h_{t-1} + dt_t * B_t * x_t
        y_t = C_t . h_t + D * x_t

    ``A`` is a learned [channels, state_dim] matrix of negative rates. ``y``
    is gated by ``silu(z)`` and projected back by ``out_proj`` into
    ``attention_output``. In the vocabulary every recurrent mixer shares,
    ``C`` reads the state as a query does (``attention_queries``), ``B``
    writes into it as a key does (``attention_keys``), ``x`` is what is
    written (``attention_values``), ``dt`` is how strongly (``betas``) and
    ``dt * A`` is the log of how much each state entry keeps (``decays``, per
    channel and state dimension).

    The values are read at the kernel call the forward makes: transformers'
    ``mamba_selective_scan(x, dt, A, B, C, D=, z=, delta_bias=)`` on a prompt,
    ``mamba_selective_state_update(state, x, dt, A, B, C, D, z=, dt_bias=)``
    on a decode step. Their arguments are found by each kernel's own
    signature; their tensors are channel-first (``x`` [batch,
    channels, seq], ``B`` [batch, state_dim, seq]; the update drops the
    sequence axis). Each value is a tokens-first view of its argument, so an
    in-place edit lands in the kernel's tensor, and an assignment is laid back
    out channel-first. ``betas`` and ``decays`` are derived from ``dt``,
    ``dt_bias`` and ``A`` the way the kernel derives them, and read-only.

    The pure-torch scan is itself the token loop, binding the state after each
    token (``SCAN_LOOP``); the decode update binds the new state once. So
    after ``nnterp.route_kernels(model.family,
    "torch")``, ``state``, ``states``, ``state_after`` and
    ``set_state_after`` reach every position of a prompt.
    """

    # a prompt's scan starts from zeros, binding the state after each token in its loop; the update's parameters
    # are the mixer's names. Inside each: y = C . h + D * x before the silu(z) gate (head_outputs), and inside the
    # update the new state as the cache's ``state.copy_`` receives it (updated_state)
    PROMPT = KernelCall(
        "mamba_selective_scan",
        None,
        Binding("ssm_state", loop=True),
        {"dt_bias": "delta_bias", "dt_softplus": "delta_softplus"},
        {"head_outputs": Binding("scan_output", under="D is not None")},
    )
    DECODE = KernelCall(
        "mamba_selective_state_update",
        "state",
        Binding("ssm_state"),
        reads={
            "head_outputs": Binding("out", under="D is not None"),
            "updated_state": Call("ssm_state.to", within="state.copy_"),
        },
    )
    PER_TOKEN = SelectiveScanLoop()
    # the scan's tensors are channel-first, tokens last; the update's have no tokens axis
    TOKEN_AXES = {"hidden_states": -1, "dt": -1, "B": -1, "C": -1, "z": -1}
    #: token_mixing's heads: each channel runs its own recurrence over its own x
    MIXING_HEADS = CHANNELS
    KIND = "Mamba-1 selective scan"
    # a prompt's final state comes back with the scan's output; a decode step's is read on either side of y
    DECODE_ORDER = RETURNED_TOGETHER

    # -- sizes ---------------------------------------------------------------------

    @property
    def channels(self) -> int:
        """Width of the scan: the mixer's ``intermediate_size``."""
        return self._module.intermediate_size

    @property
    def state_dim(self) -> int:
        """Numbers of state per channel: the mixer's ``ssm_state_size``."""
        return self._module.ssm_state_size

    @property
    def groups(self) -> int:
        """Groups of channels sharing one B and C: a Mamba-1 scan has one."""
        return 1

    # -- the call --------------------------------------------------------------------

    def _prompt_length(self, args: tuple, kwargs: dict) -> int:
        """The scan's length: its x is channel-first, [batch, channels, seq]."""
        return self.argument("hidden_states", (args, kwargs)).shape[2]

    # -- the values --------------------------------------------------------------------

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels, select=argument("C"))
    def attention_queries(self, value: Any) -> ScanQK:
        """C, what each token reads the state with, [batch, seq, 1, state_dim]: one group, shared by every channel.

        A view of the kernel's argument. Assign to replace it. Where it is a
        view of the projection's split (Mamba; not Falcon-Mamba or Jamba, which
        norm it first) torch refuses in-place edits while autograd is on: edit
        in place under ``torch.no_grad()``.
        """
        return _tokens_first(value, self.decoding()).unsqueeze(2)

    @attention_queries.postprocess
    def attention_queries(self, value: torch.Tensor) -> torch.Tensor:
        return _channel_first(value[:, :, 0], self.decoding())

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels, select=argument("B"))
    def attention_keys(self, value: Any) -> ScanQK:
        """B, where each token writes into the state, [batch, seq, 1, state_dim].

        Assign to replace it; in-place edits need ``torch.no_grad()``, as on
        ``attention_queries``.
        """
        return _tokens_first(value, self.decoding()).unsqueeze(2)

    @attention_keys.postprocess
    def attention_keys(self, value: torch.Tensor) -> torch.Tensor:
        return _channel_first(value[:, :, 0], self.decoding())

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels, select=argument("hidden_states"))
    def attention_values(self, value: Any) -> ScanValues:
        """x, what each channel writes, [batch, seq, channels]: after the convolution and the activation.

        Assign, or edit in place.
        """
        return _tokens_first(value, self.decoding())

    @attention_values.postprocess
    def attention_values(self, value: torch.Tensor) -> torch.Tensor:
        return _channel_first(value, self.decoding())

    def _betas(self) -> ScanSteps:
        """The step size softplus(dt + dt_bias), [batch, seq, channels]; derived, read-only."""
        dt, bias = self.argument("dt"), self.argument("dt_bias")
        decoding = self.decoding()
        if bias is not None:
            dt = dt + (bias.to(dt.dtype) if decoding else bias.to(dt.dtype)[..., None])
        return _tokens_first(F.softplus(dt), decoding)

    betas = DerivedEProperty(_betas, unavailable=needs_torch_kernels)

    def _decays(self) -> ScanDecays:
        """The log decay dt * A of every state entry, [batch, seq, channels, state_dim]; derived, read-only."""
        return self._betas()[..., None] * self.argument("A")

    decays = DerivedEProperty(_decays, unavailable=needs_torch_kernels)

    @EProperty(kernel("inputs"), unavailable=needs_torch_kernels, select=argument(ENTERING_STATE))
    def state_input(self, value: Any) -> ScanState:
        """The state a decode step starts from, [batch, channels, state_dim]: a copy of the cache's; ``None`` on a prompt.

        A copy because the update overwrites the cache's buffer with the new
        state in place, so the live tensor would read as this step's
        ``state_output`` by the end of the trace. Assigning it writes the value
        into the cache's buffer, which the step then starts from.
        """
        return value.clone() if self.decoding() else None

    @state_input.postprocess
    def state_input(self, value: torch.Tensor) -> torch.Tensor:
        if not self.decoding():
            raise ValueError(NOT_ON_A_PROMPT.format(path=self.path))
        cached = self.argument(ENTERING_STATE)
        with torch.no_grad():
            cached.copy_(value)
        return cached

    def _head_outputs_key(self) -> str:
        return self.inside("head_outputs")

    @EProperty(_head_outputs_key, unavailable=needs_torch_kernels)
    def attention_head_outputs(self, value: Any) -> ScanValues:
        """y = C . h + D * x, [batch, seq, channels]: the scan's output before the silu(z) gate and ``out_proj``.

        A binding inside the kernel, read before ``state_output`` on prompts and
        decode steps alike. Assign, or edit in place.
        """
        return _tokens_first(value, self.decoding())

    @attention_head_outputs.postprocess
    def attention_head_outputs(self, value: torch.Tensor) -> torch.Tensor:
        return _channel_first(value, self.decoding())

    def _state_output_key(self) -> str:
        if self.decoding():
            return kernel("output")(self) if self.reads_state_after_the_update() else self.inside("updated_state")
        if not self.argument("return_last_state"):
            raise Unavailable(f"state_output on {standard_path(self)}: {NO_FINAL_STATE}")
        return kernel("output")(self)

    # select=1: the scan's (output, last state); on a decode step the place serves one tensor
    @EProperty(_state_output_key, unavailable=needs_torch_kernels, select=1)
    def state_output(self, value: Any) -> ScanState:
        """The state after the call's last token, [batch, channels, state_dim], as the cache receives it.

        The state the scan returns on a prompt. On a decode step a copy of the
        new state: inside the update, or, when ``attention_head_outputs`` was
        read first, of the cache's buffer once the update has returned.
        Assigning it, or editing it in place, changes what the next decode step
        starts from, not this call's output.
        """
        return self.read_state_output(value, _same)

    @state_output.postprocess
    def state_output(self, value: torch.Tensor) -> Any:
        return self.place_state_output(value, _same)

    @state_output.transform
    def state_output(self, view: torch.Tensor, element: Any) -> Any:
        return self.write_back_state(view, element)

    # -- the state after every token ---------------------------------------------------------

    state = RecurrentMixer.state.laid_out(ScanState)
    states = RecurrentMixer.states.laid_out(ScanStates)
    state_trajectory = RecurrentMixer.state_trajectory.laid_out(ScanStates)

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> ScanStates:
        """The scan's states after ``positions`` of this call (``selective_scan_states``); dtype x's.

        The update's tensors have no sequence axis: a decode step's are one token.
        """
        x, dt, B = self._sequence_arguments("hidden_states", "dt", "B")
        return selective_scan_states(
            x,
            dt,
            self.argument("A"),
            B,
            self.entering_state(),
            positions=positions,
            dt_bias=self.argument("dt_bias"),
            softplus=bool(self.argument("dt_softplus")),
            dtype=dtype,
        )

    def entering_contribution(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What entering this prompt's scan with ``state`` adds: ``C_t . h_t`` to each ``y_t`` ([batch, seq,
        channels]) and ``h`` decayed over the call to the final state (``trajectory.entering_contribution``)."""
        outputs, final = entering_contribution(
            self.argument("dt"),
            self.argument("A"),
            self.argument("C"),
            state,
            dt_bias=self.argument("dt_bias"),
            softplus=bool(self.argument("dt_softplus")),
        )
        return outputs.transpose(1, 2), final

    def run_from_arguments(self, entering: torch.Tensor | None = None) -> torch.Tensor | None:
        """The scan from its arguments and ``entering`` (``trajectory.selective_scan_head_outputs``), in place of the
        pure-torch kernel, on a prompt without gradients: the head outputs, ``[batch, seq, channels]``."""
        if torch.is_grad_enabled() or not self._scans_from_arguments():
            return None
        head_outputs, last_state = self._head_outputs_from_arguments(entering)
        self._skip_with(head_outputs, last_state)
        return head_outputs.transpose(1, 2)

    def backward_through_adjoint(self, corrupt: tuple[torch.Tensor, ...] | None = None) -> AdjointRoute | None:
        """The scan from its arguments, its backward through its adjoint (``gradients.SelectiveScanAdjoint``).

        autograd's record of transformers' token loop differentiates each
        token's slice of the whole-prompt decays and writes separately, which
        is quadratic in the prompt; the adjoint is one backwards step per token.
        The forward goes on with the scan computed from the arguments as
        ``run_from_arguments`` computes it (equal to the kernel's to rounding,
        and about three times faster), and the route's head outputs are that
        tensor, which takes a gradient; nothing inside the kernel can be read.
        With ``corrupt`` (``state_patch_inputs`` of another run), the backward
        forms that run's states as it forms this run's, and pairs their
        difference with the adjoint, per channel. A decode step's update, and
        an optimized kernel, keep their own backward.
        """
        if not self._scans_from_arguments():
            return None
        x = self.argument("hidden_states")
        probe = None if corrupt is None else x.new_zeros(x.shape[0], x.shape[2], x.shape[1], dtype=torch.float32)
        adjoint = SelectiveScanAdjoint.apply(
            *(self.argument(name) for name in ("hidden_states", "dt", "A", "B", "C", "D", "dt_bias")),
            bool(self.argument("dt_softplus")),
            None if corrupt is None else SelectiveScanRun(*corrupt),
            None if probe is None else probe.requires_grad_(),
        )
        head_outputs, last_state = self._head_outputs_from_arguments(None)
        # tokens first, as attention_head_outputs serves them: the tensor whose gradient is read is on the path
        routed = head_outputs.transpose(1, 2) + adjoint.transpose(1, 2)
        self._skip_with(routed.transpose(1, 2), last_state)
        return AdjointRoute(routed, probe)

    def _scans_from_arguments(self) -> bool:
        """Whether this call is a prompt's one pure-torch scan, which ``selective_scan_head_outputs`` can take over."""
        return not (self.decoding() or self.segmented() or needs_torch_kernels(self) is not None)

    def _head_outputs_from_arguments(self, entering: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The scan's head outputs (channel-first, ``x``'s dtype) and last state, from its arguments and ``entering``."""
        names = ("hidden_states", "dt", "A", "B", "C", "D")
        head_outputs, last_state = selective_scan_head_outputs(
            *(self.argument(name) for name in names),
            entering,
            dt_bias=self.argument("dt_bias"),
            softplus=bool(self.argument("dt_softplus")),
        )
        return head_outputs.to(self.argument("hidden_states").dtype), last_state

    def _skip_with(self, head_outputs: torch.Tensor, last_state: torch.Tensor) -> None:
        """Skip the kernel call, returning what it returns from these head outputs (channel-first) and last state."""
        output = gated(head_outputs, self.argument("z"))
        self.skip_call((output, last_state) if self.argument("return_last_state") else output)

    def state_gradient_inputs(self) -> tuple[torch.Tensor, ...]:
        """The call's step sizes ``dt`` per token and channel, its ``A`` and its ``C``: what ``state_gradients``
        reads. The log decays ``dt A``, a state's size per token, are formed there, when they are needed."""
        dt, C = self._sequence_arguments("dt", "C")
        step = step_sizes(dt.detach(), self.argument("dt_bias"), bool(self.argument("dt_softplus")))
        return step.transpose(1, 2), self.argument("A").detach().float(), C.detach()

    @classmethod
    def state_gradients(cls, inputs: tuple[torch.Tensor, ...], head_output_gradients: torch.Tensor) -> ScanStates:
        """The scan's adjoint (``gradients.selective_scan_state_gradients``) from ``state_gradient_inputs`` and the
        gradient of ``attention_head_outputs`` ([batch, seq, channels]), [batch, seq, channels, state_dim]."""
        step, rate, C = inputs
        return selective_scan_state_gradients(step[..., None] * rate, C, head_output_gradients.transpose(1, 2))

    def state_patch_inputs(self) -> tuple[torch.Tensor, ...]:
        """The prompt call's steps, x, B, C and A (``gradients.SelectiveScanRun``), float32, detached: its states
        are formed where the estimate is taken, by one loop for both runs."""
        x, dt, B, C = (tensor.detach() for tensor in self._sequence_arguments("hidden_states", "dt", "B", "C"))
        step = step_sizes(dt, self.argument("dt_bias"), bool(self.argument("dt_softplus"))).detach()
        return SelectiveScanRun(step, x.float(), B.float(), C.float(), self.argument("A").detach().float())

    @classmethod
    def state_patch_estimates(
        cls, clean: tuple[torch.Tensor, ...], corrupt: tuple[torch.Tensor, ...], head_output_gradients: torch.Tensor
    ) -> torch.Tensor:
        """The patch estimate (``gradients.selective_scan_state_patch_estimates``), where the backward is not routed
        (``backward_through_adjoint`` estimates it itself)."""
        return selective_scan_state_patch_estimates(
            SelectiveScanRun(*clean), SelectiveScanRun(*corrupt), head_output_gradients
        )

    # -- token mixing ----------------------------------------------------------------------

    def token_mixing(self, positions: Positions = None, heads: Heads = None) -> ScanMixing:
        """``RecurrentMixer.token_mixing``, whose heads are the scan's channels: [batch, channels, rows, seq].

        The mix is of ``attention_values`` into ``attention_head_outputs``,
        ``C . h + D * x`` before the ``silu(z)`` gate, which stays outside it.
        """
        return super().token_mixing(positions, heads)

    def mixing_from_arguments(self, rows: torch.Tensor, heads: torch.Tensor) -> TokenMixing:
        """The scan's token mixing at ``rows`` and the channels ``heads`` (``selective_scan_mixing``), from its arguments.

        The offset holds the skip ``D * x`` and, on a decode step, the readout
        of the cached state the step starts from.
        """
        x, dt, B, C = self._sequence_arguments("hidden_states", "dt", "B", "C")
        return selective_scan_mixing(
            x,
            dt,
            self.argument("A"),
            B,
            C,
            self.argument("D"),
            self.entering_state(),
            rows,
            heads,
            dt_bias=self.argument("dt_bias"),
            softplus=bool(self.argument("dt_softplus")),
        )

    def readout_from_arguments(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``C_t . h + D x_t`` at ``rows`` with ``state`` as ``h`` (``selective_scan_readout``)."""
        x, C = self._sequence_arguments("hidden_states", "C")
        return selective_scan_readout(x, C, self.argument("D"), state, rows)

    def _sequence_arguments(self, *names: str) -> list[torch.Tensor]:
        """The kernel's arguments ``names`` with their sequence axis last; a decode step's, which have none, as one token."""
        arguments = [self.argument(name) for name in names]
        return [argument.unsqueeze(-1) for argument in arguments] if self.decoding() else arguments
