"""The block around a Mamba-1 mixer: the one-sublayer block (Mamba, Zamba)."""

from __future__ import annotations

from nnterp import Layer, unavailable

ONE_SUBLAYER = (
    "a Mamba block adds one sublayer to the residual stream, the mixer (a Zamba hybrid block's shared transformer "
    "feeds the mixer's input): layer_input + linear_attn.attention_output is layer_output"
)


class MambaLayer(Layer):
    """A Mamba / Falcon-Mamba / Zamba block: a norm and a mixer, ``layer_input + linear_attn.attention_output == layer_output``.

    The norm in front of the mixer is ``input_layernorm`` (Mamba's ``norm``),
    so ``attention_norm_output`` is what the mixer is called with. No MLP adds
    to the stream (a Zamba hybrid block's shared transformer reaches it through
    the mixer's input), so the values between the sublayers and in front of
    the MLP do not exist on this block.
    """

    layer_mid = unavailable(ONE_SUBLAYER)
    mlp_norm_output = unavailable(ONE_SUBLAYER)
    mlp_input = unavailable(ONE_SUBLAYER)
