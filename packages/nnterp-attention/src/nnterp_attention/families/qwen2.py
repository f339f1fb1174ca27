"""Qwen2: a Llama block with biased query, key and value projections."""

from transformers.models.qwen2 import modeling_qwen2 as MODELING

from nnterp import Layer, Mlp
from nnterp_attention.attention import Attention

MODEL_TYPES = ("qwen2",)
ENVOYS = {
    MODELING.Qwen2DecoderLayer: Layer,
    MODELING.Qwen2Attention: Attention,
    MODELING.Qwen2MLP: Mlp,
}
RENAME: dict = {}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
