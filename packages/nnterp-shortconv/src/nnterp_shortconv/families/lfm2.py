"""LFM2: pre-norm blocks whose sequence mixer is a gated short convolution or, at ``full_attn_idxs``, softmax attention.

Each block holds one mixer (``conv`` -> ``linear_attn``, or ``self_attn``)
behind ``operator_norm`` and a SwiGLU feed-forward (``feed_forward`` ->
``mlp``) behind ``ffn_norm``. A checkpoint's first block is a conv block.
"""

from transformers.models.lfm2 import modeling_lfm2 as MODELING

from nnterp import Layer, Mlp
from nnterp_attention.attention import Attention
from nnterp_shortconv.shortconv import ShortConv

MODEL_TYPES = ("lfm2",)
ENVOYS = {
    MODELING.Lfm2DecoderLayer: Layer,
    MODELING.Lfm2Attention: Attention,
    MODELING.Lfm2ShortConv: ShortConv,
    MODELING.Lfm2MLP: Mlp,
}
RENAME = {
    "conv": "linear_attn",
    "feed_forward": "mlp",
    "w1": "gate_proj",
    "w3": "up_proj",
    "w2": "down_proj",
    "operator_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "model.embedding_norm": "ln_final",
}
# Three blocks: conv, attention, conv, so both kinds are built and a conv block follows an attention one.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    conv_L_cache=3,
    layer_types=["conv", "full_attention", "conv"],
)
