"""Qwen3: a Llama block whose queries and keys are normalized per head before the rotary embedding.

``attention_queries`` and ``attention_keys`` are read after those norms
(``q_norm``, ``k_norm``), as the attention interface receives them.
"""

from transformers.models.qwen3 import modeling_qwen3 as MODELING

from nnterp import Layer, Mlp
from nnterp_attention.attention import Attention

MODEL_TYPES = ("qwen3",)
ENVOYS = {
    MODELING.Qwen3DecoderLayer: Layer,
    MODELING.Qwen3Attention: Attention,
    MODELING.Qwen3MLP: Mlp,
}
RENAME: dict = {}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
