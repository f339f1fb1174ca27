"""GraniteMoe: a Mixtral block whose sublayers are scaled by ``residual_multiplier`` before they join the stream.

The block adds ``attn(x) * residual_multiplier`` and
``block_sparse_moe(x) * residual_multiplier``, so ``attention_output`` and
``mlp_output`` serve those products (scaled copies; an assignment is divided
back, see ``nnterp_attention.scaled``). The mixture's ``routed_output`` and
``expert_outputs`` are the experts' own tensors, before the scaling, so
``mlp_output == routed_output * residual_multiplier`` (there is no shared
expert). The router, already named ``router``, picks the top-k logits and
takes a softmax over those alone.
"""

from typing import Any

from transformers.models.granitemoe import modeling_granitemoe as MODELING

from nnterp import Layer, Moe, Scoring
from nnterp_attention.scaled import ScaledAttention, ScaledMlp, scale_of


class GraniteMoeAttention(ScaledAttention):
    """Granite's softmax attention, whose contribution is scaled by residual_multiplier."""

    SCALE = "residual_multiplier"


class GraniteMoeMoe(ScaledMlp, Moe):
    """A mixture of experts whose output the block scales by residual_multiplier; softmax over the top-k logits."""

    SCALE = "residual_multiplier"
    SCORING = Scoring(after_top_k=True)

    def mixture_output(self, routed: Any, shared: Any) -> Any:
        """The routed experts' output times residual_multiplier: what the block adds (there is no shared expert)."""
        return Moe.mixture_output(self, routed, shared) * scale_of(self)


MODEL_TYPES = ("granitemoe",)
ENVOYS = {
    MODELING.GraniteMoeDecoderLayer: Layer,
    MODELING.GraniteMoeAttention: GraniteMoeAttention,
    MODELING.GraniteMoeMoE: GraniteMoeMoe,
}
RENAME = {"block_sparse_moe": "mlp"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
    residual_multiplier=0.5,
)
