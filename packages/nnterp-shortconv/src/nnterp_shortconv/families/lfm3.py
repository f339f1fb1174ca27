"""LFM3: LFM2's conv and attention blocks with a norm after each sublayer too (``use_sandwich_norm``), from transformers 5.24.

What a block adds to the stream is each post-norm's output
(``post_operator_norm`` -> ``post_attention_layernorm``, ``post_ffn_norm`` ->
``post_feedforward_layernorm``), where the contributions are read; the
MLP's pre-norm is ``ffn_norm`` -> ``pre_feedforward_layernorm``. Without
the sandwich the post-norms are identities and the identities still hold.
"""

from transformers.models.lfm3 import modeling_lfm3 as MODELING

from nnterp_attention.post_norm import PostNormAttention, PostNormMlp, SandwichLayer
from nnterp_shortconv.shortconv import ShortConv


class PostNormShortConv(ShortConv):
    """A short convolution whose output the block normalizes before adding it."""

    CONTRIBUTION = "../post_attention_layernorm.output"


MODEL_TYPES = ("lfm3",)
ENVOYS = {
    MODELING.Lfm3DecoderLayer: SandwichLayer,
    MODELING.Lfm3Attention: PostNormAttention,
    MODELING.Lfm3ShortConv: PostNormShortConv,
    MODELING.Lfm3MLP: PostNormMlp,
}
RENAME = {
    "conv": "linear_attn",
    "feed_forward": "mlp",
    "w1": "gate_proj",
    "w3": "up_proj",
    "w2": "down_proj",
    "operator_norm": "input_layernorm",
    "post_operator_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffn_norm": "post_feedforward_layernorm",
    "model.embedding_norm": "ln_final",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    conv_L_cache=3,
    layer_types=["conv", "full_attention", "conv"],
)
