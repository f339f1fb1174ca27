"""The envoys of the blocks around a Mamba-2 mixer, where they differ from the pre-norm block."""

from __future__ import annotations

from typing import Any

from nnterp import EProperty, Layer, unavailable
from nnterp.layouts import Residual

SINGLE_SUBLAYER = (
    "a single-sublayer block, x + mixer(norm(x)): it has no MLP, so no stream between sublayers and no MLP input"
)


class MixerLayer(Layer):
    """A block whose only sublayer is its mixer, behind its ``input_layernorm``: ``x + mixer(norm(x))``.

    ``layer_input + linear_attn.attention_output == layer_output``; the values
    that need an MLP are unavailable with the reason.
    """

    layer_mid = unavailable(SINGLE_SUBLAYER)
    mlp_norm_output = unavailable(SINGLE_SUBLAYER)
    mlp_input = unavailable(SINGLE_SUBLAYER)


class NormMixerLayer(MixerLayer):
    """A single-sublayer block whose norm is its ``norm`` child (Mamba-2's ``Mamba2Block``).

    The mixer has a ``norm`` of its own (the gated norm before ``out_proj``),
    so the block's is keyed by path rather than aliased by name.
    """

    @EProperty("norm.output")
    def attention_norm_output(self, value: Any) -> Residual:
        """What the mixer is called with: the block's norm's output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value


class SourcedLayer(Layer):
    """A block some of whose values are operations inside its own forward (a contribution scaled by a multiplier).

    A sublayer's value is typically read while the block is already running, too late to instrument the
    block's forward for that call, so it is instrumented when the envoy is built (``Standard.sourced``).
    """

    sourced = True
