"""Qwen3.5 (dense): three gated-DeltaNet blocks in four, the rest softmax attention.

The multimodal checkpoints (``qwen3_5``) are the ``qwen3_5`` family, which
serves this one's envoys on its text model.
"""

from transformers.models.qwen3_5 import modeling_qwen3_5 as MODELING

from nnterp import Mlp
from nnterp_attention import Attention
from nnterp_deltanet.blocks import HybridLayer
from nnterp_deltanet.linear_attention import LinearAttention

MODEL_TYPES = ("qwen3_5_text",)
ENVOYS = {
    MODELING.Qwen3_5DecoderLayer: HybridLayer,
    MODELING.Qwen3_5GatedDeltaNet: LinearAttention,
    MODELING.Qwen3_5Attention: Attention,
    MODELING.Qwen3_5MLP: Mlp,
}
RENAME: dict = {}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    layer_types=["linear_attention", "full_attention"],
)
