"""The blocks around a Mamba-1 mixer: the one-sublayer block (Mamba, Zamba), and Jamba's mixture of experts."""

from __future__ import annotations

from nnterp import Layer, Mlp, unavailable

ONE_SUBLAYER = (
    "a Mamba block adds one sublayer to the residual stream, the mixer (a Zamba hybrid block's shared transformer "
    "feeds the mixer's input): layer_input + linear_attn.attention_output is layer_output"
)
EXPERT_NEURONS = "a mixture of experts: each expert has its own neurons, inside the experts module"


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


class ExpertMixture(Mlp):
    """A mixture of experts in a block's feed-forward place (Jamba's ``JambaSparseMoeBlock``).

    ``mlp_output`` is what the block adds to the residual stream, as on any
    ``Mlp``. Its neurons belong to the experts, one set each, so the
    single-MLP neuron values are unavailable; ``intermediate_size`` is one
    expert's width.
    """

    @property
    def intermediate_size(self) -> int:
        """Width of one expert's hidden layer (the module's ``ffn_dim``)."""
        return self._module.ffn_dim

    mlp_activation = unavailable(EXPERT_NEURONS)
    mlp_neurons = unavailable(EXPERT_NEURONS)
