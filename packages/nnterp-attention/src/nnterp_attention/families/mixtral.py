"""Mixtral: a Mistral block whose MLP is a sparse mixture of experts.

The router (``gate`` -> ``router``) takes a softmax over every expert and
always renormalizes the top-k probabilities to sum to one.
"""

from transformers.models.mixtral import modeling_mixtral as MODELING

from nnterp import Layer, Moe, Scoring
from nnterp_attention.attention import Attention


class MixtralMoe(Moe):
    """Softmax routing, the top-k probabilities renormalized."""

    SCORING = Scoring(normalize=True)


MODEL_TYPES = ("mixtral",)
ENVOYS = {
    MODELING.MixtralDecoderLayer: Layer,
    MODELING.MixtralAttention: Attention,
    MODELING.MixtralSparseMoeBlock: MixtralMoe,
}
RENAME = {MODELING.MixtralTopKRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=2,
)
