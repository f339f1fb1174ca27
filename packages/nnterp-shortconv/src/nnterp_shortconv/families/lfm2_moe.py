"""LFM2-MoE: LFM2's blocks, whose feed-forward is a mixture of experts after the first ``num_dense_layers`` blocks.

The router (``gate`` -> ``router``) scores every expert with a sigmoid,
picks the top-k of the scores plus the block's ``expert_bias`` (a selection
bias, zero on a fresh model), and weighs them by the plain scores,
renormalized where ``norm_topk_prob`` says, times ``routed_scaling_factor``.
"""

from transformers.models.lfm2_moe import modeling_lfm2_moe as MODELING

from nnterp import Layer, Mlp, Moe, Scoring
from nnterp_attention.attention import Attention
from nnterp_shortconv.shortconv import ShortConv


class Lfm2MoeMixture(Moe):
    """Sigmoid routing, renormalized and scaled."""

    SCORING = Scoring(function="sigmoid", normalize="norm_topk_prob", scale="routed_scaling_factor")


MODEL_TYPES = ("lfm2_moe",)
ENVOYS = {
    MODELING.Lfm2MoeDecoderLayer: Layer,
    MODELING.Lfm2MoeAttention: Attention,
    MODELING.Lfm2MoeShortConv: ShortConv,
    MODELING.Lfm2MoeMLP: Mlp,
    MODELING.Lfm2MoeSparseMoeBlock: Lfm2MoeMixture,
}
RENAME = {
    "conv": "linear_attn",
    "feed_forward": "mlp",
    "gate": "router",
    "w1": "gate_proj",
    "w3": "up_proj",
    "w2": "down_proj",
    "operator_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "model.embedding_norm": "ln_final",
}
# Conv + dense MLP, attention + experts, conv + experts: every kind of block.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    conv_L_cache=3,
    num_dense_layers=1,
    num_experts=4,
    num_experts_per_tok=2,
    layer_types=["conv", "full_attention", "conv"],
)
