"""Kimi-Linear: Kimi delta attention (KDA, per-channel decays) and latent softmax attention (MLA) blocks.

transformers keeps both mixers at ``self_attn``; the delta attention is
standardized to ``linear_attn``, so ``self_attn`` on a block always means
softmax attention.
"""

from transformers.models.kimi_linear import modeling_kimi_linear as MODELING

from nnterp import Mlp, Moe, Scoring
from nnterp_attention import Attention
from nnterp_deltanet.blocks import SelfAttnMixerLayer
from nnterp_deltanet.linear_attention import KimiDeltaAttention


class KimiLinearMoe(Moe):
    """Sigmoid routing with a selection bias, within groups of experts; a shared expert added without a gate.

    The router picks each token's top-k experts by ``sigmoid(logits) +
    e_score_correction_bias`` among those of its best ``topk_group`` of
    ``num_group`` groups, weighs them by their unbiased scores, renormalized
    where the config says (``norm_topk_prob``), times
    ``routed_scaling_factor``. ``shared_experts`` is added in full.
    """

    SCORING = Scoring(
        function="sigmoid", normalize="norm_topk_prob", bias="e_score_correction_bias", scale="routed_scaling_factor"
    )
    SHARED = "shared_experts.output"


MODEL_TYPES = ("kimi_linear",)
ENVOYS = {
    MODELING.KimiLinearDecoderLayer: SelfAttnMixerLayer,
    MODELING.KimiLinearDeltaAttention: KimiDeltaAttention,
    MODELING.KimiLinearAttention: Attention,
    MODELING.KimiLinearMoE: KimiLinearMoe,
    MODELING.KimiLinearMLP: Mlp,
}
RENAME = {MODELING.KimiLinearDeltaAttention: "linear_attn", MODELING.KimiLinearTopkRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    linear_attn_config={
        "kda_layers": [1],
        "full_attn_layers": [2],
        "num_heads": 2,
        "head_dim": 8,
        "short_conv_kernel_size": 4,
    },
    first_k_dense_replace=1,
    num_experts=8,
    num_experts_per_token=2,
    num_expert_group=4,  # groups of two: the router keeps its best two groups, then their top two experts
    topk_group=2,
    moe_intermediate_size=32,
    q_lora_rank=None,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
    mla_use_nope=True,
)
