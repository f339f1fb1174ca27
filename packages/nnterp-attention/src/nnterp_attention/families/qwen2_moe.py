"""Qwen2-MoE: a Qwen2 block whose MLP is a sparse mixture of experts beside a gated shared expert.

The router (``gate`` -> ``router``) takes a softmax over every expert and
renormalizes the top-k probabilities where ``norm_topk_prob`` says. The
shared expert (``shared_expert``, a plain MLP) runs on every token; its
output times ``sigmoid(shared_expert_gate(x))`` is added to the routed
experts' sum. Blocks listed in ``mlp_only_layers`` hold a plain MLP.
"""

from transformers.models.qwen2_moe import modeling_qwen2_moe as MODELING

from nnterp import Layer, Mlp, Moe, Scoring
from nnterp_attention.attention import Attention


class Qwen2MoeMoe(Moe):
    """Softmax routing, renormalized where the config says; a shared expert behind a sigmoid gate."""

    SCORING = Scoring(normalize="norm_topk_prob")
    # The forward's second binding of shared_expert_output: the shared expert's output times its gate.
    SHARED = "source.shared_expert_output_1.output"


MODEL_TYPES = ("qwen2_moe",)
ENVOYS = {
    MODELING.Qwen2MoeDecoderLayer: Layer,
    MODELING.Qwen2MoeAttention: Attention,
    MODELING.Qwen2MoeSparseMoeBlock: Qwen2MoeMoe,
    MODELING.Qwen2MoeMLP: Mlp,
}
RENAME = {MODELING.Qwen2MoeTopKRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=4,
    num_experts_per_tok=2,
)
