"""ModernBERT's decoder: a pre-norm block whose first attention norm is the identity, and a gated MLP of its own spelling.

The block is ``x + attn(attn_norm(x))`` then ``+ mlp(mlp_norm(.))``, its norms
aliased to Llama's names, ``attn`` to ``self_attn``. The first block has no
attention norm: its ``attn_norm`` is an ``nn.Identity`` (the embeddings end in
a norm), so there ``attention_norm_output`` is ``layer_input`` itself. The
attention calls the shared interface (with a sliding window on its
``sliding_attention`` layers) and ends in its projection ``Wo`` and a dropout,
whose output is what the block adds.

The MLP projects to twice its width (``Wi``), splits that into an input and a
gate, and sums ``drop(act(input) * gate)`` with ``Wo``, aliased ``down_proj``:
``mlp_activation`` is ``act(input)`` and ``mlp_neurons`` the product. The
head is a transform (``lm_head``: a projection, an activation, a norm) then
the unembedding (``decoder``), after the final norm (``HEAD``).
"""

from transformers.models.modernbert_decoder import modeling_modernbert_decoder as MODELING

from nnterp import Layer, Mlp
from nnterp_attention.attention import Attention

MODEL_TYPES = ("modernbert-decoder",)
ENVOYS = {
    MODELING.ModernBertDecoderLayer: Layer,
    MODELING.ModernBertDecoderAttention: Attention,
    MODELING.ModernBertDecoderMLP: Mlp,
}
RENAME = {
    "model.embeddings.tok_embeddings": "embed_tokens",
    "model.final_norm": "ln_final",
    "attn": "self_attn",
    "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
    "mlp.Wo": "mlp.down_proj",
    "mlp.act": "mlp.act_fn",
}
#: What the causal LM applies to the last block's output (``nnterp.analysis.lens``): the final norm, a transform, the unembedding.
HEAD = ("model.final_norm", "lm_head", "decoder")
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    local_attention=128,  # a window of 64 keys, longer than the test prompts: every pattern is the full causal one
    layer_types=["full_attention", "sliding_attention"],
    cls_token_id=2,
    sep_token_id=1,
)
