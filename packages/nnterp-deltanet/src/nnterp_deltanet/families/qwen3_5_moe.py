"""Qwen3.5 MoE: the Qwen3.5 hybrid with a sparse mixture of experts as every block's feed-forward."""

from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as MODELING

from nnterp import Mlp, Moe, Scoring
from nnterp_attention import Attention
from nnterp_deltanet.blocks import HybridLayer
from nnterp_deltanet.linear_attention import LinearAttention


class Qwen3_5MoeMoe(Moe):
    """Softmax routing, always renormalized over the top-k; a shared expert behind a sigmoid gate."""

    SCORING = Scoring(normalize=True)
    SHARED = "source.shared_expert_output_1.output"


MODEL_TYPES = ("qwen3_5_moe_text", "qwen3_5_moe")
ENVOYS = {
    MODELING.Qwen3_5MoeDecoderLayer: HybridLayer,
    MODELING.Qwen3_5MoeGatedDeltaNet: LinearAttention,
    MODELING.Qwen3_5MoeAttention: Attention,
    MODELING.Qwen3_5MoeSparseMoeBlock: Qwen3_5MoeMoe,
    MODELING.Qwen3_5MoeMLP: Mlp,
}
RENAME = {MODELING.Qwen3_5MoeTopKRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    layer_types=["linear_attention", "full_attention"],
)
