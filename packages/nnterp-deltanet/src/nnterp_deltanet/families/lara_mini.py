"""Lara-mini (transformers 5.24 on): gated-DeltaNet, sliding and full softmax-attention blocks, each with a mixture of
experts; Qwen3-Next's blocks under other names."""

from transformers.models.lara_mini import modeling_lara_mini as MODELING

from nnterp import Mlp, Moe, Scoring
from nnterp_attention import Attention
from nnterp_deltanet.blocks import HybridLayer
from nnterp_deltanet.linear_attention import LinearAttention


class LaraMiniMoe(Moe):
    """Softmax routing, renormalized where the config says; a shared expert added in full, without Qwen3-Next's gate."""

    SCORING = Scoring(normalize="norm_topk_prob")
    SHARED = "shared_expert.output"


MODEL_TYPES = ("lara_mini",)
ENVOYS = {
    MODELING.LaraMiniDecoderLayer: HybridLayer,
    MODELING.LaraMiniGatedDeltaNet: LinearAttention,
    MODELING.LaraMiniAttention: Attention,
    MODELING.LaraMiniSparseMoeBlock: LaraMiniMoe,
    MODELING.LaraMiniMLP: Mlp,
}
RENAME = {MODELING.LaraMiniTopKRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    layer_types=["linear_attention", "sliding_attention", "full_attention"],
    sliding_window=64,  # longer than the test prompts, so every pattern is the full causal one
)
