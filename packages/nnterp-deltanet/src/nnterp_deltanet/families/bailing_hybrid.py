"""Bailing-Hybrid (transformers 5.20 on): Kimi delta attention (KDA) and latent softmax attention (MLA) blocks, each
with a dense or a mixture-of-experts feed-forward.

As on Kimi-Linear, both mixers sit at ``self_attn`` in transformers; the delta
attention is standardized to ``linear_attn``.
"""

from transformers.models.bailing_hybrid import modeling_bailing_hybrid as MODELING

from nnterp import Mlp, Moe, Scoring
from nnterp_attention import Attention
from nnterp_deltanet.blocks import SelfAttnMixerLayer
from nnterp_deltanet.linear_attention import KimiDeltaAttention


class BailingHybridMoe(Moe):
    """Sigmoid routing with a selection bias, within groups of experts; a shared expert added without a gate.

    Kimi-Linear's mixture: the router picks each token's top-k experts by
    ``sigmoid(logits) + e_score_correction_bias`` among those of its best
    ``topk_group`` of ``num_group`` groups, weighs them by their unbiased
    scores, renormalized where the config says (``norm_topk_prob``), times
    ``routed_scaling_factor``. ``shared_experts`` is added in full.
    """

    SCORING = Scoring(
        function="sigmoid", normalize="norm_topk_prob", bias="e_score_correction_bias", scale="routed_scaling_factor"
    )
    SHARED = "shared_experts.output"


MODEL_TYPES = ("bailing_hybrid",)
ENVOYS = {
    MODELING.BailingHybridDecoderLayer: SelfAttnMixerLayer,
    MODELING.BailingHybridDeltaAttention: KimiDeltaAttention,
    MODELING.BailingHybridAttention: Attention,
    MODELING.BailingHybridMoE: BailingHybridMoe,
    MODELING.BailingHybridMLP: Mlp,
}
RENAME = {MODELING.BailingHybridDeltaAttention: "linear_attn", MODELING.BailingHybridTopkRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    layer_group_size=3,
    layer_types=["linear_attention", "linear_attention", "full_attention"],
    mlp_layer_types=["dense", "sparse", "sparse"],
    linear_num_heads=2,
    linear_head_dim=8,
    num_local_experts=8,
    num_experts_per_tok=2,
    n_group=4,  # groups of two: the router keeps its best two groups, then their top two experts
    topk_group=2,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
    num_mtp_layers=0,
    pad_token_id=0,
    eos_token_id=1,
)
