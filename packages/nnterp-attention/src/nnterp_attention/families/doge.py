"""Doge: a Llama-shaped block whose residual is scaled per channel, and an attention masked by a learned bias.

The block keeps the residual through learned vectors before each addition::

    layer_mid    = input_residual * layer_input + attention_output
    layer_output = post_attention_residual * layer_mid + mlp_output

so the contributions add up only once the residual is scaled (a checkpoint
trained with both vectors at one gives the plain identity). ``layer_mid`` is
what ``post_attention_layernorm`` is called with, as on Llama; the vectors
are the block's parameters ``input_residual`` and ``post_attention_residual``.

The attention (dynamic mask attention) adds to its scores, inside the shared
eager function, a bias per head and key computed from the values,
``exp(A * softplus(dt_proj(values)))``, through the mask argument; past
``keep_window_size`` keys it also masks all but each head's top ones. So
``attention_scores`` include that bias and, with zero queries, the pattern is
its softmax over the causal keys, not uniform. The other values are the
standard attention's.

With ``is_moe`` the MLP is a cross-domain mixture of product-key experts
(``DogeCDMoE``): a shared gated MLP plus experts that are embedding rows,
routed inline with no router or experts module. Its ``mlp_output`` is served;
its neurons are not (see ``PRODUCT_KEY_EXPERTS``). In earlier releases (5.17)
the block passes the mixture's whole tuple on to its dropout, and a model
with ``is_moe`` cannot run (``MOE_BROKEN``).
"""

from typing import Any

from transformers.models.doge import modeling_doge as MODELING

from nnterp import EProperty, Layer, Mlp, contribution, unavailable
from nnterp.forward_source import ForwardSource
from nnterp.layouts import Residual
from nnterp_attention.attention import Attention

PRODUCT_KEY_EXPERTS = (
    "Doge's mixture of product-key experts routes inline, its experts rows of two embeddings, with no router or "
    "experts module to read routing at, and one activation module it calls for the shared MLP and the experts "
    "alike; read mlp_output, the mixture's sum"
)
#: Whether the installed block takes the hidden states out of the tuple the mixture of experts returns.
MOE_RUNS = ForwardSource.of(MODELING.DogeDecoderLayer.forward).reads("config.is_moe")
MOE_BROKEN = (
    "in this transformers DogeDecoderLayer.forward hands the tuple DogeCDMoE returns to its dropout, so a model with "
    "is_moe fails before the mixture's output reaches the stream; use a transformers whose block unpacks it (5.25 does)"
)
#: The block's per-channel residual scales, before the attention's addition and before the MLP's.
RESIDUAL_SCALES = ("input_residual", "post_attention_residual")


class DogeLayer(Layer):
    """Doge's block: the stream scaled per channel before each addition."""

    def stream_after_adding(self, index: int, stream: Any, contribution: Any) -> Any:
        """``scale * stream + contribution``, the scale the block's vector for that addition (``RESIDUAL_SCALES``)."""
        return getattr(self._module, RESIDUAL_SCALES[index]).detach() * stream + contribution


class DogeCDMoE(Mlp):
    """Doge's mixture of product-key experts: its contribution, the first element of what it returns."""

    mlp_activation = unavailable(PRODUCT_KEY_EXPERTS)
    mlp_neurons = unavailable(PRODUCT_KEY_EXPERTS)

    @EProperty(contribution, unavailable=None if MOE_RUNS else MOE_BROKEN)
    def mlp_output(self, value: Any) -> Residual:
        """What the mixture adds to the residual stream, [batch, seq, hidden_size]: shared MLP plus experts.

        Assign or edit in place.
        """
        return value


MODEL_TYPES = ("doge",)
ENVOYS = {
    MODELING.DogeDecoderLayer: DogeLayer,
    MODELING.DogeAttention: Attention,
    MODELING.DogeMLP: Mlp,
    MODELING.DogeCDMoE: DogeCDMoE,
}
RENAME: dict = {}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    num_experts=16,
    num_experts_per_tok=4,
)
