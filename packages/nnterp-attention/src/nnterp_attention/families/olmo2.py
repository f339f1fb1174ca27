"""OLMo-2: a post-norm block, each sublayer reading the stream and normalized after.

``attention_output`` and ``mlp_output`` are the post-norms' outputs (see
``nnterp_attention.post_norm``); there is no pre-norm, so
``attention_norm_output`` and ``mlp_norm_output`` are unavailable, and
``layer_mid`` is what the MLP is called with.
"""

from transformers.models.olmo2 import modeling_olmo2 as MODELING

from nnterp_attention.post_norm import PostNormAttention, PostNormLayer, PostNormMlp

MODEL_TYPES = ("olmo2",)
ENVOYS = {
    MODELING.Olmo2DecoderLayer: PostNormLayer,
    MODELING.Olmo2Attention: PostNormAttention,
    MODELING.Olmo2MLP: PostNormMlp,
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
