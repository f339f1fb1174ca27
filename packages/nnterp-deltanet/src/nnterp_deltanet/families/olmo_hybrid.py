"""OLMo-Hybrid: pre-norm gated-DeltaNet blocks and OLMo-2-style post-norm softmax-attention blocks.

On an attention block the norms sit after each sublayer and before the
residual add, so the contributions are the norms' outputs. The gated DeltaNet
may write with strength up to 2 (``linear_allow_neg_eigval``).
"""

from typing import Any

from transformers.models.olmo_hybrid import modeling_olmo_hybrid as MODELING

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP, EProperty, Mlp, unavailable
from nnterp.layouts import Residual
from nnterp_attention.post_norm import PostNormAttention
from nnterp_deltanet.blocks import HybridLayer
from nnterp_deltanet.linear_attention import LinearAttention


class PostNormLayer(HybridLayer):
    """The attention block: ``x + norm(attn(x))`` then ``+ norm(mlp(.))``, with no norm in front of either sublayer."""

    attention_norm_output = unavailable(POST_NORM_ATTENTION)
    mlp_norm_output = unavailable(POST_NORM_MLP)

    @EProperty("mlp.input", shared=True)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size]: what the MLP reads.

        Assign or edit in place.
        """
        return value


def _mlp_contribution(envoy: Mlp) -> str:
    return (
        "../post_feedforward_layernorm.output"
        if hasattr(envoy.parent._module, "post_feedforward_layernorm")
        else "output"
    )


class OlmoHybridMlp(Mlp):
    """The feed-forward of either block: its own output on a DeltaNet block, its post-norm's on an attention block."""

    @EProperty(_mlp_contribution)
    def mlp_output(self, value: Any) -> Residual:
        """What the feed-forward adds to the residual stream, [batch, seq, hidden_size].

        The module's output on a pre-norm block, the norm after it on a
        post-norm one. Assign or edit in place.
        """
        return value


MODEL_TYPES = ("olmo_hybrid",)
ENVOYS = {
    MODELING.OlmoHybridLinearAttentionDecoderLayer: HybridLayer,
    MODELING.OlmoHybridAttentionDecoderLayer: PostNormLayer,
    MODELING.OlmoHybridGatedDeltaNet: LinearAttention,
    MODELING.OlmoHybridAttention: PostNormAttention,
    MODELING.OlmoHybridMLP: OlmoHybridMlp,
}
RENAME: dict = {}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    layer_types=["linear_attention", "full_attention"],
)
