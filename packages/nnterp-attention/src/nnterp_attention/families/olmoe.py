"""OLMoE: a Llama block whose attention normalizes its projected queries and keys, and whose MLP is a mixture of experts.

The router (``gate`` -> ``router``) takes a softmax over every expert and
renormalizes the top-k probabilities where ``norm_topk_prob`` says (OLMoE's
checkpoints do not).
"""

from transformers.models.olmoe import modeling_olmoe as MODELING

from nnterp import Layer, Moe, Scoring
from nnterp_attention.attention import Attention


class OlmoeMoe(Moe):
    """Softmax routing, renormalized where the config says."""

    SCORING = Scoring(normalize="norm_topk_prob")


MODEL_TYPES = ("olmoe",)
ENVOYS = {
    MODELING.OlmoeDecoderLayer: Layer,
    MODELING.OlmoeAttention: Attention,
    MODELING.OlmoeSparseMoeBlock: OlmoeMoe,
}
RENAME = {MODELING.OlmoeTopKRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=4,
    num_experts_per_tok=2,
)
