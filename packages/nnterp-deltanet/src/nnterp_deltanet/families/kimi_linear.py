"""Kimi-Linear: Kimi delta attention (KDA, per-channel decays) and latent softmax attention (MLA) blocks.

transformers keeps both mixers at ``self_attn``; the delta attention is
standardized to ``linear_attn``, so ``self_attn`` on a block always means
softmax attention.
"""

from transformers.models.kimi_linear import modeling_kimi_linear as MODELING

from nnterp import Mlp
from nnterp_attention import Attention
from nnterp_deltanet.blocks import ExpertsMlp, SelfAttnMixerLayer
from nnterp_deltanet.linear_attention import KimiDeltaAttention

MODEL_TYPES = ("kimi_linear",)
ENVOYS = {
    MODELING.KimiLinearDecoderLayer: SelfAttnMixerLayer,
    MODELING.KimiLinearDeltaAttention: KimiDeltaAttention,
    MODELING.KimiLinearAttention: Attention,
    MODELING.KimiLinearMoE: ExpertsMlp,
    MODELING.KimiLinearMLP: Mlp,
}
RENAME = {MODELING.KimiLinearDeltaAttention: "linear_attn"}
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
    num_experts=4,
    num_experts_per_token=2,
    moe_intermediate_size=32,
    q_lora_rank=None,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
    mla_use_nope=True,
)
