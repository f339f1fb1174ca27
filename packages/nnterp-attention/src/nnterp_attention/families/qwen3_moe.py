"""Qwen3-MoE: a Qwen3 block whose MLP is a sparse mixture of experts.

The router (``gate`` -> ``router``) takes a softmax over every expert and
renormalizes the top-k probabilities where ``norm_topk_prob`` says. Blocks
listed in ``mlp_only_layers`` hold a plain MLP.
"""

from transformers.models.qwen3_moe import modeling_qwen3_moe as MODELING

from nnterp import Layer, Mlp, Moe, Scoring
from nnterp_attention.attention import Attention


class Qwen3MoeMoe(Moe):
    """Softmax routing, renormalized where the config says."""

    SCORING = Scoring(normalize="norm_topk_prob")


MODEL_TYPES = ("qwen3_moe",)
ENVOYS = {
    MODELING.Qwen3MoeDecoderLayer: Layer,
    MODELING.Qwen3MoeAttention: Attention,
    MODELING.Qwen3MoeSparseMoeBlock: Qwen3MoeMoe,
    MODELING.Qwen3MoeMLP: Mlp,
}
RENAME = {MODELING.Qwen3MoeTopKRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
)
