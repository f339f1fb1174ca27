"""DeepSeek-V3: pre-norm blocks of multi-head latent attention, the first dense and the rest a mixture of experts.

The attention compresses its queries and keys through low-rank projections
and splits each head into a rotary and a non-rotary part, so its queries
and keys are ``qk_head_dim`` wide and its values ``v_head_dim``. The first
``first_k_dense_replace`` blocks hold a plain MLP. The router (``gate`` ->
``router``) scores every expert with a sigmoid, picks the top-k of the
scores plus ``e_score_correction_bias`` within the best ``topk_group`` of
``n_group`` groups, weighs them by the plain scores, renormalized where
``norm_topk_prob`` says, times ``routed_scaling_factor``. The shared experts
(``shared_experts``, one MLP) run on every token and are added ungated.
"""

from transformers.models.deepseek_v3 import modeling_deepseek_v3 as MODELING

from nnterp import Layer, Mlp, Moe, Scoring
from nnterp_attention.attention import Attention


class DeepseekV3Moe(Moe):
    """Sigmoid routing with a selection bias within groups, renormalized and scaled; ungated shared experts."""

    SCORING = Scoring(
        function="sigmoid", normalize="norm_topk_prob", bias="e_score_correction_bias", scale="routed_scaling_factor"
    )
    SHARED = "shared_experts.output"


MODEL_TYPES = ("deepseek_v3",)
ENVOYS = {
    MODELING.DeepseekV3DecoderLayer: Layer,
    MODELING.DeepseekV3Attention: Attention,
    MODELING.DeepseekV3MoE: DeepseekV3Moe,
    MODELING.DeepseekV3MLP: Mlp,
}
RENAME = {MODELING.DeepseekV3TopkRouter: "router"}
# Block 0 is dense, blocks 1 and 2 mixtures whose eight experts fall in four groups, two of them kept per token.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    first_k_dense_replace=1,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
)
