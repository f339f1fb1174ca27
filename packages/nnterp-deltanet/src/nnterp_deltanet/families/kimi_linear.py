"""Kimi-Linear: Kimi delta attention (KDA, per-channel decays) and latent softmax attention (MLA) blocks.

transformers keeps both mixers at ``self_attn``; the delta attention is
standardized to ``linear_attn``, so ``self_attn`` on a block always means
softmax attention.
"""

from typing import Any

from transformers.models.kimi_linear import modeling_kimi_linear as MODELING

from nnterp import Mlp
from nnterp_attention import Attention
from nnterp_deltanet.blocks import ExpertsMlp, HybridLayer
from nnterp_deltanet.linear_attention import KimiDeltaAttention

#: Where the block keeps its ``self_attn`` child, which the property below serves only when it is softmax attention.
CHILD = "_kimi_self_attn"


class KimiLayer(HybridLayer):
    """A Kimi-Linear block, whose ``self_attn`` child is the delta attention on a KDA block.

    That child is served as ``linear_attn`` only, so ``self_attn`` means
    softmax attention on every family and the block's contributions are
    counted once.
    """

    @property
    def self_attn(self) -> Any:
        """The block's softmax attention (MLA); a KDA block has none: its mixer is ``linear_attn``."""
        child = self.__dict__.get(CHILD)
        if child is None or isinstance(child, KimiDeltaAttention):
            # An AttributeError hands the lookup to HybridLayer.__getattr__, which raises MissingMixer.
            raise AttributeError("self_attn")
        return child

    @self_attn.setter
    def self_attn(self, child: Any) -> None:
        self.__dict__[CHILD] = child


MODEL_TYPES = ("kimi_linear",)
ENVOYS = {
    MODELING.KimiLinearDecoderLayer: KimiLayer,
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
