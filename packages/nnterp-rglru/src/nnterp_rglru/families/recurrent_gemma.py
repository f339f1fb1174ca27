"""RecurrentGemma (Griffin): pre-norm blocks whose temporal mixer is an RG-LRU recurrent block or local attention.

Both mixers sit at ``temporal_block``; the RG-LRU inside a recurrent block
(``temporal_block.rg_lru``) is standardized to ``linear_attn``, the local
attention to ``self_attn``, whose queries each see only the last
``attention_window_size`` keys (``LocalAttention.window``). The pattern of
block types is the config's ``block_types`` (transformers 5.17 names them
``recurrent``/``attention``, 5.25 ``linear_attention``/``sliding_attention``;
the config maps either).
"""

from transformers.models.recurrent_gemma import modeling_recurrent_gemma as MODELING

from nnterp import Layer, Mlp
from nnterp_rglru.local_attention import LocalAttention
from nnterp_rglru.rg_lru import RgLru

MODEL_TYPES = ("recurrent_gemma",)
ENVOYS = {
    MODELING.RecurrentGemmaDecoderLayer: Layer,
    MODELING.RecurrentGemmaAttention: LocalAttention,
    MODELING.RecurrentGemmaRglru: RgLru,
    MODELING.RecurrentGemmaMlp: Mlp,
}
RENAME = {
    "temporal_block.rg_lru": "linear_attn",
    MODELING.RecurrentGemmaAttention: "self_attn",
    "temporal_pre_norm": "input_layernorm",
    "channel_pre_norm": "post_attention_layernorm",
    "mlp_block": "mlp",
    "model.final_norm": "ln_final",
}
# Two recurrent blocks, then local attention: every kind, and a recurrent block after a recurrent one. The window is
# shorter than the test prompt, so its last queries see only their window.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    lru_width=16,
    conv1d_width=4,
    attention_window_size=16,
    block_types=["recurrent", "recurrent", "attention"],
)
