"""Mistral: a Llama block whose attention looks back over a sliding window of keys."""

from transformers.models.mistral import modeling_mistral as MODELING

from nnterp import Layer, Mlp
from nnterp_attention.attention import Attention

MODEL_TYPES = ("mistral",)
ENVOYS = {
    MODELING.MistralDecoderLayer: Layer,
    MODELING.MistralAttention: Attention,
    MODELING.MistralMLP: Mlp,
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
    sliding_window=64,  # longer than the test prompts, so every pattern is the full causal one
)
