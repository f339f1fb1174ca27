"""Llama: the pre-norm block every other family is described against."""

from transformers.models.llama import modeling_llama as MODELING

from nnterp import Layer, Mlp
from nnterp_attention.attention import Attention

MODEL_TYPES = ("llama",)
ENVOYS = {
    MODELING.LlamaDecoderLayer: Layer,
    MODELING.LlamaAttention: Attention,
    MODELING.LlamaMLP: Mlp,
}
RENAME: dict = {}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)
