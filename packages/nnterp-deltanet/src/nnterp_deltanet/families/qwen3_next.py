"""Qwen3-Next: gated-DeltaNet and gated softmax-attention blocks, each with a sparse mixture of experts."""

from transformers.models.qwen3_next import modeling_qwen3_next as MODELING

from nnterp import Mlp, Moe, Scoring
from nnterp_attention import Attention
from nnterp_deltanet.blocks import HybridLayer
from nnterp_deltanet.linear_attention import LinearAttention


class Qwen3NextMoe(Moe):
    """Softmax routing, renormalized where the config says; a shared expert behind a sigmoid gate."""

    SCORING = Scoring(normalize="norm_topk_prob")
    SHARED = "source.shared_expert_output_1.output"


MODEL_TYPES = ("qwen3_next",)
ENVOYS = {
    MODELING.Qwen3NextDecoderLayer: HybridLayer,
    MODELING.Qwen3NextGatedDeltaNet: LinearAttention,
    MODELING.Qwen3NextAttention: Attention,
    MODELING.Qwen3NextSparseMoeBlock: Qwen3NextMoe,
    MODELING.Qwen3NextMLP: Mlp,
}
RENAME = {MODELING.Qwen3NextTopKRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
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
