"""Gemma-2: a sandwich block, a norm before and after each sublayer.

``attention_output`` and ``mlp_output`` are the post-norms' outputs, what the
block adds (see ``nnterp_attention.post_norm``). The MLP's pre-norm is
``pre_feedforward_layernorm``; ``post_attention_layernorm`` keeps Gemma's
meaning, the attention's post-norm. ``attention_scores`` are read after the
logit soft-capping, as they enter the softmax.
"""

from transformers.models.gemma2 import modeling_gemma2 as MODELING

from nnterp_attention.post_norm import PostNormAttention, PostNormMlp, SandwichLayer

MODEL_TYPES = ("gemma2",)
ENVOYS = {
    MODELING.Gemma2DecoderLayer: SandwichLayer,
    MODELING.Gemma2Attention: PostNormAttention,
    MODELING.Gemma2MLP: PostNormMlp,
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
)
