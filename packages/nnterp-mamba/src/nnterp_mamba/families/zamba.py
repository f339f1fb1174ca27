"""Zamba: Mamba-1 blocks, and hybrid blocks where a shared transformer feeds the mixer's input.

A Mamba block is ``x + mamba(input_layernorm(x))``. A hybrid block first runs
the shared transformer (attention and MLP over ``x`` concatenated with the
embeddings; every hybrid block's copy has the same weights) and projects it
(``linear``) to ``t``, then is ``x + mamba(input_layernorm(x + t))``, as on
Zamba2: the transformer reaches the stream only through the mixer's input. So
on both kinds ``layer_input + linear_attn.attention_output == layer_output``
(``CONTRIBUTIONS``), and the hybrid block's attention is ``layers[i].self_attn``,
whose ``attention_output`` is what it hands the shared transformer's MLP.

The mixer splits its channels into ``n_mamba_heads`` heads, each a Mamba-1
scan over its own channels with its own B and C, and calls the scan once per
head, in a loop (``ZambaScan``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from nnsight.intervention.interleaver import Mediator
from transformers.models.zamba import modeling_zamba as MODELING

from nnterp import EProperty, RecurrentMixer, Unavailable, needs_torch_kernels
from nnterp.analysis.mixing import TokenMixing
from nnterp.components.declaration import ENTERING_STATE, DeclarationMismatch, ForwardLayout, Located, forward_layout
from nnterp.components.per_call import per_call, pinned, replace_per_call
from nnterp.forward_source import Binding, Call, ForwardSource, NotInForward
from nnterp.layouts import ScanQK, ScanState, ScanStates, ScanValues
from nnterp.order import standard_path
from nnterp.positions import Positions
from nnterp_attention.attention import Attention
from nnterp_mamba.blocks import MambaLayer
from nnterp_mamba.mixing import selective_scan_mixing, selective_scan_readout
from nnterp_mamba.selective_scan import NO_FINAL_STATE, NOT_ON_A_PROMPT, SelectiveScan, _same
from nnterp_mamba.trajectory import selective_scan_states

#: The attribute of a served tensor holding its version when served: an in-place edit since then is written back.
SERVED_VERSION = "_nnterp_served_version"
#: The attribute of a served copy of an input holding the view of the stacked tensor it was copied from.
SERVED_FROM = "_nnterp_copied_from"
#: The attribute of served head outputs holding the gate silu(z) takes, [batch, channels, seq], for their write-back.
GATE = "_nnterp_gate"


def _served(value: torch.Tensor) -> torch.Tensor:
    """``value``, remembering its version as served (``_edited``)."""
    setattr(value, SERVED_VERSION, value._version)
    return value


def _copy_of(view: torch.Tensor) -> torch.Tensor:
    """A copy of ``view`` of a stacked tensor, served so that an in-place edit is copied back into it (``_write_back``)."""
    served = _served(view.clone())
    setattr(served, SERVED_FROM, view)
    return served


def _write_back(envoy: Any, served: torch.Tensor, element: Any) -> Any:
    """The write-back of an input served by ``_copy_of``: into the stacked tensor, if it was edited in place; what
    goes back at its place, ``element``, unchanged."""
    if _edited(served):
        _copy_into(getattr(served, SERVED_FROM), served)
    return element


def _copy_into(view: torch.Tensor, value: torch.Tensor) -> None:
    """Write ``value`` into ``view``, a view of the forward's tensor, as data autograd does not see.

    B and C are views of one ``torch.split``, whose outputs torch refuses to
    use once one was edited in place while autograd is on: a written input
    is data, and gradients flow as the forward computed them.
    """
    view.data.copy_(value.detach())


def _edited(value: torch.Tensor) -> bool:
    """Whether ``value``, served by ``_served``, was edited in place since."""
    return value._version != getattr(value, SERVED_VERSION, value._version)


def _gated(outputs: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Head outputs [batch, seq, channels] as the loop's concatenation takes them: gated by silu(z), channel-first."""
    return (outputs.transpose(1, 2) * F.silu(z)).to(dtype)


def _channel_first(stacked: torch.Tensor) -> torch.Tensor:
    """Every head's [heads, batch, head_dim, ...] as the whole mixer's [batch, channels, ...], head h's channels
    ``h * head_dim:(h + 1) * head_dim``."""
    return stacked.transpose(0, 1).flatten(1, 2)


# -- where the forward's loop over heads is, found in the installed forward ------------------------------------------


@dataclass(frozen=True)
class HeadLoop:
    """Where the forward calls one of the mixer's kernels once per head: the labels of what the mixer reads around
    that loop, in the installed forward."""

    #: What is read before the loop, by the mixer's names, in the forward's order: the stacked tensors, then the
    #: loop's ``range`` (``"loop"``).
    before: tuple[tuple[str, str], ...]
    #: The concatenation of the heads' gated outputs after the loop.
    joined: str
    #: A prompt's stack of the heads' final states; ``None`` for a decode step.
    final_state: str | None

    @property
    def loop(self) -> str:
        """The label of the loop's ``range``, where the inputs are served."""
        return self.before[-1][1]


def _head_loop(
    forward: ForwardSource,
    located: Located,
    reads: Mapping[str, Binding | Call],
    final_state: Binding | None,
) -> HeadLoop:
    """Find, around ``located`` (a kernel call the forward makes once per head), the places ``reads`` names before the
    loop, the ``torch.cat`` on the call's arms after it, and ``final_state`` after it.

    Raises:
        NotInForward: a place is not where the mixer reads it, saying what was expected and what was found.
    """
    function = located.call.function
    if len(located.path) != 1:
        raise NotInForward(
            f"{function} called by the forward itself, once per head; it is called in {located.names[0]}"
        )
    call = forward[located.path[0]]
    if not call.loops or not call.loops[-1].iterable:
        raise NotInForward(f"{function} called once per head in a loop over a range; found at line {call.line}")
    header, order = call.loops[-1].header, forward.operations.index
    # the call producing the loop's iterable is numbered after its arguments: the last of the iterable's labels
    loop = forward[call.loops[-1].iterable[-1]]
    found = []
    for name, spec in reads.items():
        operation = spec.find(forward)
        if operation.loops or order(operation) > order(loop):
            raise NotInForward(
                f"{spec} before `{header}` (line {loop.line}), where every head's tensors are whole; found at line "
                f"{operation.line}"
            )
        found.append((name, operation))
    found.sort(key=lambda item: order(item[1]))
    joins = [
        operation
        for operation in forward.calls("torch.cat")
        if operation.arms == call.arms and not operation.loops and order(operation) > order(call)
    ]
    if len(joins) != 1:
        lines = ", ".join(f"line {operation.line}" for operation in joins) or "none"
        raise NotInForward(
            f"one call of `torch.cat` joining the heads after `{header}` (line {loop.line}); found: {lines}"
        )
    stacked = None
    if final_state is not None:
        stacked = final_state.find(forward)
        if stacked.loops or order(stacked) < order(call):
            raise NotInForward(f"{final_state} after `{header}` (line {loop.line}); found at line {stacked.line}")
    return HeadLoop(
        tuple((name, operation.label) for name, operation in found) + (("loop", loop.label),),
        joins[0].label,
        None if stacked is None else stacked.label,
    )


def find_head_loops(mixer: type["ZambaScan"], module_class: type, layout: ForwardLayout) -> dict[bool, HeadLoop]:
    """The prompt's (``False``) and the decode step's (``True``) loops over heads around ``layout``'s calls.

    Raises:
        NotInForward: a place the mixer reads around a loop is not where it reads it.
    """
    forward = ForwardSource.of(module_class.forward)
    return {
        False: _head_loop(forward, layout.prompt, {**mixer.STACKED, **mixer.PROMPT_READS}, mixer.FINAL_STATE),
        True: _head_loop(forward, layout.decode, {**mixer.STACKED, **mixer.DECODE_READS}, None),
    }


@functools.cache
def head_loops(mixer: type["ZambaScan"], module_class: type) -> dict[bool, HeadLoop]:
    """``find_head_loops`` in ``module_class``'s installed forward, which its declaration was checked against."""
    return find_head_loops(mixer, module_class, forward_layout(mixer, module_class))


class ZambaScan(SelectiveScan):
    """Zamba's mixer: a Mamba-1 scan per Mamba head, each head a group of channels with its own B and C.

    The forward computes every head's tensors at once, stacked on a leading
    heads axis (``x``, ``dt`` and the gate ``z`` [heads, batch, head_dim,
    seq], ``B`` and ``C`` [heads, batch, seq, state_dim], ``A`` [heads,
    head_dim, state_dim]), then calls the scan (a decode step's update) once
    per head, in a loop, on that head's slice. So the values are read where
    they are whole: the inputs at those stacked bindings, before the loop
    (``STACKED``), served as the whole mixer's, head ``h`` owning channels
    ``h * head_dim:(h + 1) * head_dim`` and group ``h`` of ``B`` and ``C``; an
    assignment or in-place edit lands in the stacked tensor every head's call
    slices. The head outputs are read inside each head's kernel call in turn
    and served, and written, at the concatenation of the gated heads after the
    loop; the final state is the stack of the heads' states the cache
    receives on a prompt, the cache's buffer, updated head by head, on a
    decode step. With one head this is Mamba-1's mixer exactly. Every place
    is declared by what it is and found in the installed forward around the
    kernel call that fires (``head_loops``): the bindings by name, the loop by
    the call the kernel call sits in, the join as the ``torch.cat`` on the
    kernel call's arm after it.

    The state after every token is each head's scan loop's, one call after
    the other: head ``h``'s token ``t`` is occurrence ``first + h * seq + t``
    of the loop's state (``RecurrentMixer.CALLS_PER_FORWARD``), so after
    ``nnterp.route_kernels(model.family, "torch")`` ``states``,
    ``state_after(t)`` and ``set_state_after(t, value)`` join or split the
    heads' states; each head's head outputs are read on the way
    (``passing_call``), before the next head's tokens pass them. With more
    than one head ``state``, one place per token, is unavailable, and once a
    state is written at token ``t`` the first head has passed the later
    tokens: read what follows through ``attention_head_outputs`` or
    ``attention_output``. Written inputs are copied into the forward's
    tensors as data (``_copy_into``).
    """

    CALLS_PER_FORWARD = "n_mamba_heads"
    # a single scan call's: the adjoint route, the scan from the arguments, what an entering state adds (so knockout
    # runs whole prompts) and the states' gradient, which a loop of calls over the heads' slices does not make
    backward_through_adjoint = RecurrentMixer.backward_through_adjoint
    entering_contribution = RecurrentMixer.entering_contribution
    run_from_arguments = RecurrentMixer.run_from_arguments
    state_gradients = RecurrentMixer.__dict__["state_gradients"]
    #: The forward's bindings of every head's tensors before its loop over heads, by the mixer's argument names: the
    #: value each name ends up holding (its last binding). ``parameters`` is the split of the selective projection
    #: into (dt before ``dt_proj``, B, C).
    STACKED = {
        "z": Binding("gate"),
        "hidden_states": Binding("hidden_states_B_C"),
        "parameters": Call("torch.split"),
        "dt": Binding("time_step"),
        "dt_bias": Binding("time_proj_bias"),
        "A": Binding("A"),
    }
    #: Read with them on a decode step: the cache's state buffer, [batch, heads, head_dim, state_dim].
    DECODE_READS = {ENTERING_STATE: Binding("recurrent_state", first=True)}
    #: Read with them on a prompt: whether the scan returns its final state (a cache was passed).
    PROMPT_READS = {"return_last_state": Binding("output_final_state")}
    #: A prompt's stack of the heads' final states, [batch, heads, head_dim, state_dim], which the cache receives.
    FINAL_STATE = Binding("final_state")

    @classmethod
    def check_forward(cls, module_class: type, layout: ForwardLayout) -> None:
        """The places read around the loops over heads are where the mixer reads them (``find_head_loops``)."""
        find_head_loops(cls, module_class, layout)

    # -- sizes ---------------------------------------------------------------------

    @property
    def groups(self) -> int:
        """Groups of channels with their own B and C: the mixer's ``n_mamba_heads``, one per Mamba head."""
        return self._module.n_mamba_heads

    @property
    def head_dim(self) -> int:
        """Channels per Mamba head: the mixer's ``mamba_head_dim``."""
        return self._module.mamba_head_dim

    # -- the call ------------------------------------------------------------------

    def call_arguments(self) -> dict[str, Any]:
        """The forward's stacked tensors of this call, by the mixer's argument names, read once per call before its loop.

        Read in the forward's order with, on a decode step, the cache's state
        buffer (``ENTERING_STATE``, [batch, heads, head_dim, state_dim]), on a
        prompt whether the scan returns a final state, and last the loop's
        ``range``, where the inputs are served (``_before_the_loop``). With
        them the entering state is copied, and the occurrence of the first
        head's head outputs counted, before any head's kernel runs.
        """
        arguments = per_call(self, "arguments", self._read_stacked)
        per_call(self, "entering_state", lambda: self._copied_state(arguments))
        per_call(self, "first head output", self._first_head_output)
        return arguments

    def head_loop(self) -> HeadLoop:
        """Where the kernel that fires on this call is called once per head, in the installed forward (``head_loops``).

        Raises:
            nnterp.Unavailable: the forward does not make the calls and bindings the family declares; says why.
        """
        try:
            return head_loops(type(self), type(self._module))[self.decoding()]
        except DeclarationMismatch as error:
            raise Unavailable(f"{standard_path(self)}: {error}") from None

    def _read_stacked(self) -> dict[str, Any]:
        """The stacked bindings, then the loop's ``range``, in the forward's order; this invoke's rows of each.

        nnsight serves an invoke its rows of a tensor whose leading axis is
        the batch's, and would take the heads axis of a stacked tensor for it:
        they are read whole and narrowed here, on their batch axis.
        """
        places = self.head_loop().before
        source = self.source
        mediator = Mediator.current("call_arguments")
        group, mediator.batch_group = mediator.batch_group, None
        try:
            read = {name: getattr(source, label).output for name, label in places}
        finally:
            mediator.batch_group = group
        batcher = None if mediator.interleaver is None else mediator.interleaver.batcher
        if batcher is None or not batcher.batching or group is None:
            return read
        start, size = group
        for name in ("z", "hidden_states", "dt"):
            read[name] = read[name].narrow(1, start, size)
        read["parameters"] = tuple(part.narrow(1, start, size) for part in read["parameters"])
        if read.get(ENTERING_STATE) is not None:
            read[ENTERING_STATE] = read[ENTERING_STATE].narrow(0, start, size)
        return read

    def argument(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        """The whole mixer's argument ``name``, laid out as one scan call's would be, channels head after head.

        ``hidden_states`` and ``dt`` [batch, channels, seq], ``A`` [channels,
        state_dim], ``dt_bias`` [channels], ``D`` [channels]; ``B`` and ``C``
        with a groups axis, [batch, heads, state_dim, seq]; the entering state
        [batch, channels, state_dim], a view of the cache's buffer. A decode
        step's have no sequence axis, as the update's.
        """
        arguments = self.call_arguments() if arguments is None else arguments
        if name == "D":
            return self._module.D.flatten()
        if name in ("dt_softplus", "delta_softplus"):
            return True  # the forward passes it so to every head's call
        if name in ("B", "C"):
            value = arguments["parameters"][1 if name == "B" else 2].permute(1, 0, 3, 2)
            return value[..., 0] if self.decoding() else value
        value = arguments.get(name)
        if value is None or name == "return_last_state":
            return value
        if name == ENTERING_STATE:
            return value.view(value.shape[0], -1, value.shape[-1])
        if name in ("A", "dt_bias"):
            return value.flatten(0, 1)
        value = _channel_first(value)
        return value[..., 0] if self.decoding() else value

    def call_length(self) -> int:
        """This call's sequence length: that of its x, [heads, batch, head_dim, seq] (a decode step's is 1)."""
        return self.call_arguments()["hidden_states"].shape[-1]

    def _before_the_loop(self) -> str:
        """The key of the inputs: the loop's ``range``, the last binding ``call_arguments`` reads, before any head's call.

        Not a tensor, so nnsight leaves it whole, and an input's write puts it back unchanged.
        """
        return f"source.{self.head_loop().loop}.output"

    # -- the inputs ----------------------------------------------------------------

    def _x(self) -> torch.Tensor:
        """A view of every head's x, [heads, batch, head_dim, seq], as [batch, seq, channels]."""
        stacked = self.call_arguments()["hidden_states"]
        heads, batch, head_dim, seq = stacked.shape
        return stacked.permute(1, 3, 0, 2).view(batch, seq, heads * head_dim)

    def _qk(self, index: int) -> torch.Tensor:
        """A view of every head's B (``index`` 1) or C (2), [heads, batch, seq, state_dim], as [batch, seq, heads, state_dim]."""
        return self.call_arguments()["parameters"][index].permute(1, 2, 0, 3)

    def _write(self, view: torch.Tensor, value: torch.Tensor) -> Any:
        """Copy ``value`` into ``view`` of a stacked tensor; what goes back at the loop's ``range``: itself."""
        _copy_into(view, value)
        return self.call_arguments()["loop"]

    @EProperty(_before_the_loop, unavailable=needs_torch_kernels)
    def attention_values(self, value: Any) -> ScanValues:
        """x, what each channel writes, [batch, seq, channels]: after the convolution and the activation.

        A copy of the forward's x of every head, before its loop: assign, or
        edit in place; either is copied into the tensor each head's call slices.
        """
        return _copy_of(self._x())

    @attention_values.postprocess
    def attention_values(self, value: torch.Tensor) -> Any:
        return self._write(self._x(), value)

    attention_values.transform(_write_back)

    @EProperty(_before_the_loop, unavailable=needs_torch_kernels)
    def attention_queries(self, value: Any) -> ScanQK:
        """C, what each token reads the state with, [batch, seq, heads, state_dim]: one group per Mamba head.

        A copy of the forward's C of every head, before its loop: assign, or
        edit in place, as ``attention_values``.
        """
        return _copy_of(self._qk(2))

    @attention_queries.postprocess
    def attention_queries(self, value: torch.Tensor) -> Any:
        return self._write(self._qk(2), value)

    attention_queries.transform(_write_back)

    @EProperty(_before_the_loop, unavailable=needs_torch_kernels)
    def attention_keys(self, value: Any) -> ScanQK:
        """B, where each token writes into the state, [batch, seq, heads, state_dim]: one group per Mamba head.

        Assign, or edit in place, as ``attention_values``.
        """
        return _copy_of(self._qk(1))

    @attention_keys.postprocess
    def attention_keys(self, value: torch.Tensor) -> Any:
        return self._write(self._qk(1), value)

    attention_keys.transform(_write_back)

    @EProperty(_before_the_loop, unavailable=needs_torch_kernels)
    def state_input(self, value: Any) -> ScanState:
        """The state a decode step starts from, [batch, channels, state_dim]: a copy of the cache's; ``None`` on a prompt.

        A copy because the heads' updates overwrite the cache's buffer in
        place. Assigning it writes the value into the buffer, which every
        head's update then starts from.
        """
        return self.argument(ENTERING_STATE).clone() if self.decoding() else None

    @state_input.postprocess
    def state_input(self, value: torch.Tensor) -> Any:
        if not self.decoding():
            raise ValueError(NOT_ON_A_PROMPT.format(path=self.path))
        placed = self._write(self.argument(ENTERING_STATE), value)
        # what is computed from the call's arguments starts from the assigned state too
        replace_per_call(self, "entering_state", value.detach().clone())
        return placed

    # -- the head outputs and the final state ------------------------------------------

    def _first_head_output(self) -> int:
        """The occurrence of the head outputs' binding inside the kernel that this call's first head makes: its count
        before the loop, as every head's kernel call binds it once."""
        label = self.kernel_call().reads["head_outputs"].find(self.body_source()).label
        location = f"{self.path}.{self._body_path()}.{label}.output"
        return Mediator.current(location).occurrence(location)

    def _head_output(self, head: int) -> torch.Tensor:
        """Head ``head``'s y, read inside its kernel call once per call: [batch, head_dim, seq] ([batch, head_dim])."""
        read = per_call(self, "head outputs read", dict)
        if head not in read:
            inside = self.inside("head_outputs").split(".")[:-1]
            with pinned(self._peek("first head output") + head):
                read[head] = functools.reduce(getattr, inside, self).output
        return read[head]

    def passing_call(self, call: int) -> None:
        """Head ``call``'s y, read on the way where the per-token states move on to the next head's kernel call."""
        if call < self.groups - 1:
            self._head_output(call)

    def _read_head_outputs(self) -> torch.Tensor:
        """Every head's y, read inside its kernel call in turn: [batch, channels, seq], a decode step's [batch, channels]."""
        return torch.cat([self._head_output(head) for head in range(self.groups)], dim=1)

    def _head_outputs_key(self) -> str:
        per_call(self, "head outputs", self._read_head_outputs)
        return f"source.{self.head_loop().joined}.output"

    @EProperty(_head_outputs_key, unavailable=needs_torch_kernels)
    def attention_head_outputs(self, value: Any) -> ScanValues:
        """y = C . h + D * x, [batch, seq, channels]: the scan's output before the silu(z) gate and ``out_proj``.

        Each head's binding inside its own kernel call, read in turn, served
        at the concatenation of the heads' gated outputs after the loop. Assign
        it, or edit it in place: the concatenation becomes the written y gated
        by the forward's ``silu(z)``, as each kernel gates its own.
        """
        outputs = per_call(self, "head outputs", self._read_head_outputs)
        served = _served(outputs.unsqueeze(1) if self.decoding() else outputs.transpose(1, 2))
        # the write-back runs when the worker has moved on, maybe to another call: it keeps its own gate
        setattr(served, GATE, _channel_first(self.call_arguments()["z"]))
        return served

    @attention_head_outputs.postprocess
    def attention_head_outputs(self, value: torch.Tensor) -> torch.Tensor:
        joined = getattr(self.source, self.head_loop().joined).output
        return _gated(value, _channel_first(self.call_arguments()["z"]), joined.dtype)

    @attention_head_outputs.transform
    def attention_head_outputs(self, view: torch.Tensor, element: torch.Tensor) -> torch.Tensor:
        return _gated(view, getattr(view, GATE), element.dtype) if _edited(view) else element

    def _state_output_key(self) -> str:
        if self.decoding():
            # at the heads' outputs' place, so that they are read on the way, in either order of the two
            return self._head_outputs_key()
        if not self.call_arguments()["return_last_state"]:
            raise Unavailable(f"state_output on {standard_path(self)}: {NO_FINAL_STATE}")
        return f"source.{self.head_loop().final_state}.output"

    @EProperty(_state_output_key, unavailable=needs_torch_kernels)
    def state_output(self, value: Any) -> ScanState:
        """The state after the call's last token, [batch, channels, state_dim], as the cache receives it.

        On a prompt, a view of the stack of the heads' final states the cache
        receives. On a decode step, once every head's update has run, a copy
        of the cache's buffer, which the updates overwrite in place. Assigning
        it, or editing it in place, changes what the next decode step starts
        from, not this call's output.
        """
        if self.decoding():
            buffer = self.argument(ENTERING_STATE)
            return self.serve_state(buffer, _same, buffer=buffer)
        return value.view(value.shape[0], -1, value.shape[-1])

    @state_output.postprocess
    def state_output(self, value: torch.Tensor) -> torch.Tensor:
        if self.decoding():
            self.write_updated_state(value, _same)
            return getattr(self.source, self.head_loop().joined).output
        return value.reshape(value.shape[0], self.groups, self.head_dim, value.shape[-1])

    @state_output.transform
    def state_output(self, view: torch.Tensor, element: Any) -> Any:
        return self.write_back_state(view, element)

    # -- the math, head by head ---------------------------------------------------------

    def _head_channels(self) -> list[tuple[int, slice]]:
        """Each head and its channels."""
        width = self.head_dim
        return [(head, slice(head * width, (head + 1) * width)) for head in range(self.groups)]

    def states_from_arguments(self, positions: Positions, dtype: torch.dtype | None) -> ScanStates:
        """Each head's scan states (``selective_scan_states``) over its channels with its B, concatenated."""
        x, dt, B = self._sequence_arguments("hidden_states", "dt", "B")
        A, bias, entering = self.argument("A"), self.argument("dt_bias"), self.entering_state()
        states = [
            selective_scan_states(
                x[:, channels],
                dt[:, channels],
                A[channels],
                B[:, head],
                None if entering is None else entering[:, channels],
                positions=positions,
                dt_bias=None if bias is None else bias[channels],
                dtype=dtype,
            )
            for head, channels in self._head_channels()
        ]
        return torch.cat(states, dim=-2)

    def mixing_from_arguments(self, rows: torch.Tensor, heads: torch.Tensor) -> TokenMixing:
        """Each head's token mixing (``selective_scan_mixing``) at the chosen channels it owns, with its B and C."""
        x, dt, B, C = self._sequence_arguments("hidden_states", "dt", "B", "C")
        A, D, bias, entering = self.argument("A"), self.argument("D"), self.argument("dt_bias"), self.entering_state()
        batch, _, seq = x.shape
        matrix = torch.zeros(batch, len(heads), len(rows), seq, device=x.device)
        offset = torch.empty(batch, len(rows), len(heads), device=x.device)
        owner = heads // self.head_dim
        for head, channels in self._head_channels():
            chosen = torch.nonzero(owner == head).flatten()
            if len(chosen) == 0:
                continue
            mixing = selective_scan_mixing(
                x[:, channels],
                dt[:, channels],
                A[channels],
                B[:, head],
                C[:, head],
                D[channels],
                None if entering is None else entering[:, channels],
                rows,
                heads[chosen] - channels.start,
                dt_bias=None if bias is None else bias[channels],
            )
            matrix[:, chosen], offset[:, :, chosen] = mixing.matrix, mixing.offset
        return TokenMixing(matrix, offset)

    def readout_from_arguments(self, state: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Each head's readout (``selective_scan_readout``) of its channels of ``state`` with its C, concatenated."""
        x, C = self._sequence_arguments("hidden_states", "C")
        D = self.argument("D")
        return torch.cat(
            [
                selective_scan_readout(x[:, channels], C[:, head], D[channels], state[:, channels], rows)
                for head, channels in self._head_channels()
            ],
            dim=-1,
        )


MODEL_TYPES = ("zamba",)


ENVOYS = {
    MODELING.ZambaMambaDecoderLayer: MambaLayer,
    MODELING.ZambaHybridLayer: MambaLayer,
    MODELING.ZambaAttention: Attention,
    MODELING.ZambaMambaMixer: ZambaScan,
}
RENAME = {
    "mamba": "linear_attn",
    "mamba_decoder.mamba": "linear_attn",
    "mamba_decoder.input_layernorm": "input_layernorm",
    "shared_transf.self_attn": "self_attn",
    "model.final_layernorm": "ln_final",
}
# Only the mixer adds to the stream: the shared transformer's attention and MLP reach it through the mixer's input.
CONTRIBUTIONS = (("linear_attn", "attention_output"),)
# Blocks 2 and 3 are hybrid (transformers ties the shared transformer's weights across at least two); one Mamba head
# (the tests load two as well); initializer_range five times the default, so that a written state shows in later tokens.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=4,
    attn_layer_period=2,
    attn_layer_offset=0,
    num_attention_heads=2,
    num_key_value_heads=1,
    mamba_d_state=4,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_dt_rank=4,
    n_mamba_heads=1,
    initializer_range=0.1,
)
