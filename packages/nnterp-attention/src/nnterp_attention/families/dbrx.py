"""DBRX: a pre-norm block whose attention and norms sit in one child, and whose MLP is a mixture of experts.

The block is ``norm_attn_norm`` then ``ffn`` (-> ``mlp``). ``norm_attn_norm``
runs ``norm_1`` (-> ``input_layernorm``), ``attn`` (-> ``self_attn``), adds
its output to the stream and runs ``norm_2`` (-> ``post_attention_layernorm``),
returning the stream and its norm; the block adds ``ffn``'s output to that
stream. So the pre-norm block's values hold as they are, read at the aliased
modules. The attention is the standard one: one fused ``Wqkv``, clamped to
``clip_qkv`` and split, then transformers' attention interface.

The router's logits are its ``layer`` (a Linear); ``DbrxFFN`` takes their
softmax, the top-k, and divides the top-k weights by their
``moe_normalize_expert_weights``-norm. With that p at 1, the config's
default, which DBRX's released configs keep, that is their sum:
``Scoring(normalize=True)`` (another p, or none, is not a renormalization the
scoring describes). The
experts run one after another in ``DbrxExperts``' own forward, so there is no
per-slot output (``expert_outputs``), and there is no shared expert.
"""

from transformers.models.dbrx import modeling_dbrx as MODELING

from nnterp import Layer, Moe, Scoring
from nnterp_attention.attention import Attention


class DbrxMoe(Moe):
    """Softmax routing, the top-k weights divided by their 1-norm; the router's logits are its ``layer``'s output."""

    LOGITS = "layer.output"
    SCORING = Scoring(normalize=True)


MODEL_TYPES = ("dbrx",)
ENVOYS = {
    MODELING.DbrxBlock: Layer,
    MODELING.DbrxAttention: Attention,
    MODELING.DbrxFFN: DbrxMoe,
}
RENAME = {
    "transformer.blocks": "layers",
    "transformer.wte": "embed_tokens",
    "transformer.norm_f": "ln_final",
    "norm_attn_norm.attn": "self_attn",
    "norm_attn_norm.norm_1": "input_layernorm",
    "norm_attn_norm.norm_2": "post_attention_layernorm",
    "ffn": "mlp",
}
# The attention clamps its projection to clip_qkv unconditionally, and torch refuses a clamp with no bound: the
# checkpoints set 8. It reads attn_config.rope_theta, which DbrxAttentionConfig does not declare (the rotary embedding
# takes the model's rope_parameters). moe_normalize_expert_weights stays at its default 1, what SCORING describes.
TINY_CONFIG = dict(
    vocab_size=64,
    d_model=32,
    n_layers=2,
    n_heads=4,
    max_seq_len=64,
    attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0),
    ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2),
)
