"""RWKV (RWKV-4): every block is a WKV time mixing and a token-shifted channel mixing."""

from transformers.models.rwkv import modeling_rwkv as MODELING

from nnterp import Mlp
from nnterp_rwkv.blocks import RwkvLayer
from nnterp_rwkv.wkv import Wkv

MODEL_TYPES = ("rwkv",)
ENVOYS = {
    MODELING.RwkvBlock: RwkvLayer,
    MODELING.RwkvSelfAttention: Wkv,
    MODELING.RwkvFeedForward: Mlp,
}
RENAME = {
    "rwkv.blocks": "layers",
    "rwkv.embeddings": "embed_tokens",
    "rwkv.ln_out": "ln_final",
    "head": "lm_head",
    "attention": "linear_attn",
    "feed_forward": "mlp",
    "ln1": "input_layernorm",
    "ln2": "post_attention_layernorm",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    attention_hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=3,
    # the model halves the residual stream after block 1 in inference: the layer suite checks it
    rescale_every=2,
    context_length=64,
)
