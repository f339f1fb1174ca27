"""Gemma-3's text model: Gemma-2's sandwich block, with per-head query and key norms.

Sliding-window and full-attention blocks are interleaved (``layer_types``); both are
served the same way.
"""

from transformers.models.gemma3 import modeling_gemma3 as MODELING

from nnterp_attention.post_norm import PostNormAttention, PostNormMlp, SandwichLayer

MODEL_TYPES = ("gemma3_text",)
ENVOYS = {
    MODELING.Gemma3DecoderLayer: SandwichLayer,
    MODELING.Gemma3Attention: PostNormAttention,
    MODELING.Gemma3MLP: PostNormMlp,
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
    sliding_window=64,  # longer than the test prompts, so every pattern is the full causal one
    layer_types=["sliding_attention", "full_attention"],
)
