"""How a recurrent mixer comes to hold the state after every token of a prompt: one strategy per mixer kind.

A prompt's kernel usually carries the state between chunks and never holds it
per token. A mixer kind gets the per-token states one of three ways, and says
which in ``RecurrentMixer.PER_TOKEN``:

- :data:`TOKEN_LOOP` (gated DeltaNet): the decode step's kernel is a loop over
  tokens binding the state after each; ``route_kernels(family, "torch")`` binds
  the prompt's kernel name to that loop too.
- :data:`SCAN_LOOP` (Mamba-1): the prompt's pure-torch kernel is itself the
  loop; routing binds each kernel name to its own pure-torch function, past
  transformers' hub dispatcher.
- :class:`ChunkBoundaries` (Mamba-2): the prompt's kernel binds every chunk
  boundary's state in one tensor; with a chunk size of 1, a per-model switch
  (:meth:`ChunkBoundaries.enable`), every token is a boundary.
- :data:`ALWAYS` (RG-LRU, short convolution, lightning attention, mLSTM):
  nothing to switch on: the plain-torch forward binds the state after every
  token on every call, or the kind computes it exactly from the call's values.

``route_kernels`` reads the strategy for what to bind, ``states`` for why it is
unavailable, and the test kit and the benchmarks for how to turn it on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..forward_source import callee
from .call_site import bound_kernel, needs_kernel_call, needs_torch_kernels
from .declaration import KernelCall, kernel_function

if TYPE_CHECKING:
    from .recurrent import RecurrentMixer

TRACED_BEFORE_ROUTING = (
    "nnterp.route_kernels(model.family, 'torch') ran after this mixer was first traced: nnsight compiled its "
    "forward with the kernels bound then, and it keeps calling the chunked one. Route before the first trace "
    "that touches the mixer (load the model again to apply the routing to it)"
)


class PerToken:
    """How a mixer kind gets the state after every token of a prompt (see the module's docstring)."""

    #: Whether it takes ``route_kernels(family, "torch")``, process-wide and before a model's first trace; else a
    #: per-model switch (``enable``).
    routed: bool
    #: What ``states`` says while the strategy is not in effect.
    hint: str

    def routed_function(
        self, mixer: type["RecurrentMixer"], call: KernelCall, pure: Mapping[str, Callable]
    ) -> Callable:
        """What ``route_kernels(family, "torch")`` binds ``call``'s name to: by default its own pure-torch function.

        ``pure`` maps each of the mixer's kernel names to its pure-torch function.
        """
        return pure[call.function]

    def body_of(self, mixer: type["RecurrentMixer"], call: KernelCall) -> KernelCall:
        """The kernel whose body ``call`` runs once the strategy is in effect, where its ``token_state`` is bound."""
        return call

    def reason(self, envoy: "RecurrentMixer") -> str | None:
        """Why ``envoy``'s per-token states are unavailable now, or ``None``."""
        raise NotImplementedError

    def enable(self, model: Any, enabled: bool = True) -> None:
        """Turn the per-model switch on (or back off) for ``model``'s mixers of this kind."""
        raise TypeError(f"{type(self).__name__} has no per-model switch: route the family's kernels instead")


class TokenLoop(PerToken):
    """Per-token states from the decode kernel's token loop, to which routing sends the prompt too."""

    routed = True
    hint = (
        "the state after each token is materialized only by the token-by-token kernel; the chunked kernel a "
        "prompt runs through carries it between chunks. Call nnterp.route_kernels(model.family, 'torch') before "
        "tracing this layer (slower, like attn_implementation='eager')"
    )

    def loop(self, mixer: type["RecurrentMixer"]) -> KernelCall:
        """The call whose pure-torch function is the loop binding the state after each token."""
        return mixer.DECODE

    def routed_function(
        self, mixer: type["RecurrentMixer"], call: KernelCall, pure: Mapping[str, Callable]
    ) -> Callable:
        return pure[self.loop(mixer).function]

    def body_of(self, mixer: type["RecurrentMixer"], call: KernelCall) -> KernelCall:
        return self.loop(mixer)

    def reason(self, envoy: "RecurrentMixer") -> str | None:
        """Why the prompt does not run through the loop: no Python source, not routed, or compiled before routing."""
        reason = needs_torch_kernels(envoy)
        if reason is not None:
            return reason
        layout = envoy.forward_layout()
        module = envoy._module
        loop = layout.decode if self.loop(type(envoy)) is type(envoy).DECODE else layout.prompt
        loop_body = callee(bound_kernel(module, loop)).torch_function
        if bound_kernel(module, layout.prompt) is loop_body:
            return None
        live = kernel_function(type(module), layout.prompt)
        return TRACED_BEFORE_ROUTING if live is loop_body else self.hint


class ScanLoop(TokenLoop):
    """Per-token states from the prompt's own pure-torch kernel, a loop over tokens; routing binds each name to its own."""

    hint = (
        "the scan's token loop binds the state after every token, but it sits behind transformers' hub "
        "dispatcher until the kernel names are routed; call nnterp.route_kernels(model.family, 'torch') before "
        "the first trace that touches this mixer"
    )

    def loop(self, mixer: type["RecurrentMixer"]) -> KernelCall:
        return mixer.PROMPT

    def routed_function(
        self, mixer: type["RecurrentMixer"], call: KernelCall, pure: Mapping[str, Callable]
    ) -> Callable:
        return pure[call.function]

    def body_of(self, mixer: type["RecurrentMixer"], call: KernelCall) -> KernelCall:
        return call


#: The chunk a caller that runs transformers' pure-torch chunk scan (reading its kernel values needs it) caps a
#: continuation's chunks at (``ChunkBoundaries.fitted``). That scan builds ``[chunk, chunk]`` decay and score
#: matrices per head for every chunk, work per token growing with the chunk, while what it carries from chunk to
#: chunk is one state per chunk: on Mamba-2's 24 heads x 64 x state 128, 64-token chunks cost 0.6x to 0.8x per
#: token what 256-token ones do, on a CPU.
TORCH_SCAN_CHUNK = 64


@dataclass(frozen=True)
class ChunkBoundaries(PerToken):
    """Per-token states from the chunk boundaries of the prompt's kernel, one token apart with a chunk size of 1.

    The mixer module's ``chunk_size`` attribute, read by its forward on
    every call, is the switch; ``config`` names the config attribute its
    chunk size was built from, restored by ``enable(model, False)``.
    """

    config: str = "chunk_size"
    routed = False
    hint = (
        "the chunk scan materializes the state only at chunk boundaries, every {chunk} tokens "
        "(chunk_size={chunk}); call nnterp.chunk_per_token(model) to set every Mamba-2 mixer's chunk_size to 1, "
        "so every token is a boundary (slower on long prompts)"
    )

    def reason(self, envoy: "RecurrentMixer") -> str | None:
        """Why the boundaries are not every token: no Python source, or a chunk size other than 1."""
        reason = needs_torch_kernels(envoy)
        if reason is not None:
            return reason
        chunk = envoy._module.chunk_size
        return None if chunk == 1 else self.hint.format(chunk=chunk)

    def enable(self, model: Any, enabled: bool = True) -> None:
        """Set the chunk size of every mixer of ``model`` that gets its states this way: 1, or back to its config's.

        A model loaded by path holds meta modules until its first trace
        replaces them; ``enabled=True`` loads its weights first
        (``model.dispatch()``) so the setting lands on the modules that run.
        """
        if enabled and not getattr(model, "dispatched", True):
            model.dispatch()
        config = model._module.config.get_text_config()
        for mixer in model.modules(
            include_fn=lambda envoy: isinstance(getattr(envoy, "PER_TOKEN", None), ChunkBoundaries)
        ):
            mixer._module.chunk_size = 1 if enabled else getattr(config, type(mixer).PER_TOKEN.config)

    @staticmethod
    @contextlib.contextmanager
    def fitted(mixers: Iterable["RecurrentMixer"], length: int, longest: int | None = None) -> Iterator[None]:
        """While the block runs: the chunked scans among ``mixers`` take chunks no longer than a call of ``length``
        tokens needs, nor than ``longest``, then their chunk sizes are restored.

        A chunk scan pads a call to a whole chunk, so a continuation shorter
        than a chunk would pay for the whole chunk; its chunk becomes the
        power of two that holds it (at least 16, the smallest tile of the
        GPU kernels' matrix products). A caller running the pure-torch scan
        caps it with ``longest`` (``TORCH_SCAN_CHUNK``). The outputs are the
        same up to float rounding.
        """
        chunked = [mixer._module for mixer in mixers if isinstance(type(mixer).PER_TOKEN, ChunkBoundaries)]
        built = [module.chunk_size for module in chunked]
        holds = max(16, 1 << (length - 1).bit_length())
        if longest is not None:
            holds = min(holds, longest)
        try:
            for module, chunk in zip(chunked, built, strict=True):
                module.chunk_size = min(chunk, holds)
            yield
        finally:
            for module, chunk in zip(chunked, built, strict=True):
                module.chunk_size = chunk


#: Gated DeltaNet's strategy.
TOKEN_LOOP = TokenLoop()
#: Mamba-1's strategy.
SCAN_LOOP = ScanLoop()


def needs_recurrent_routing(envoy: "RecurrentMixer") -> str | None:
    """Why the state after each token is unavailable on ``envoy``, or ``None``: its kind's ``PER_TOKEN`` says."""
    return type(envoy).PER_TOKEN.reason(envoy)


class Always(PerToken):
    """The state after every token needs no routing and no switch: available whenever the forward makes its calls."""

    routed = False
    hint = ""

    def reason(self, envoy: "RecurrentMixer") -> str | None:
        return needs_kernel_call(envoy)


#: A kind whose per-token states need nothing switched on (see the module's docstring).
ALWAYS = Always()
