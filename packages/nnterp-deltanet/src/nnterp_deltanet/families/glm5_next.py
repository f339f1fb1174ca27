"""GLM-5-Next (transformers 5.17 on): Kimi delta attention (KDA) and indexed latent attention (DSA) blocks on
residual streams that hyper-connections mix (mHC), each with a dense or a mixture-of-experts feed-forward.

transformers ships it only as its multimodal wrapper, which this family loads
for text: the wrapper is registered as the model type's causal LM
(``CAUSAL_LM``). Its vision tower is not served. As on Kimi-Linear, both
mixers sit at ``self_attn``; the delta attention is standardized to
``linear_attn``. After the last block the model averages the streams
(``hc_head``) before the final norm.
"""

from transformers.models.glm5_next import modeling_glm5_next as MODELING

from nnterp import HyperConnectionLayer, Mlp, Moe, Scoring, TupleLayer
from nnterp_attention import Attention
from nnterp_deltanet.blocks import SelfAttnMixerLayer
from nnterp_deltanet.linear_attention import KimiDeltaAttention


class Glm5NextLayer(HyperConnectionLayer, SelfAttnMixerLayer, TupleLayer):
    """GLM-5-Next's block: it returns the indexer's choices beside the streams, for a block that shares them."""

    STREAMS = "attn_hc.hc_mult"


class Glm5NextMoe(Moe):
    """DeepSeek-V3's routing: sigmoid scores, a selection bias within groups, renormalized and scaled; ungated shared experts.

    The experts clamp their gate and up projections at ``swiglu_limit``.
    """

    SCORING = Scoring(
        function="sigmoid", normalize="norm_topk_prob", bias="e_score_correction_bias", scale="routed_scaling_factor"
    )
    SHARED = "shared_experts.output"


CAUSAL_LM = MODELING.Glm5NextForConditionalGeneration
MODEL_TYPES = ("glm5_next",)
ENVOYS = {
    MODELING.Glm5NextTextDecoderLayer: Glm5NextLayer,
    MODELING.Glm5NextTextLinearAttention: KimiDeltaAttention,
    MODELING.Glm5NextTextAttention: Attention,
    MODELING.Glm5NextTextMoE: Glm5NextMoe,
    MODELING.Glm5NextTextMLP: Mlp,
}
RENAME = {MODELING.Glm5NextTextLinearAttention: "linear_attn", MODELING.Glm5NextTextTopkRouter: "router"}
TINY_CONFIG = dict(
    text_config=dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        # the indexed attention takes no rotary part (NoPE)
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=0,
        qk_nope_head_dim=16,
        v_head_dim=8,
        index_topk=64,  # more than the test prompts, so the indexer keeps every token: the full causal pattern
        index_head_dim=16,
        index_n_heads=2,
        index_kpool=2,
        # 5.17 spells the indexed blocks deepseek_sparse_attention, later releases indexed_attention; all read the first
        layer_types=["linear_attention", "deepseek_sparse_attention", "linear_attention", "deepseek_sparse_attention"],
        indexer_types=["full"] * 4,
        mlp_layer_types=["dense", "sparse", "sparse", "dense"],
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=4,  # groups of two: the router keeps its best two groups, then their top two experts
        topk_group=2,
        linear_num_heads=2,
        linear_head_dim=8,
        hc_mult=3,  # with two, a doubly stochastic mixing is symmetric: a transposed one would go unnoticed
        hc_sinkhorn_iters=4,
        pad_token_id=0,
    ),
    vision_config=dict(
        depth=1, hidden_size=16, intermediate_size=32, out_hidden_size=32, num_heads=2, projection_intermediate_size=32
    ),
)
