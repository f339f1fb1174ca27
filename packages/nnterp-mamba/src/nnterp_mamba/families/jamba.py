"""Jamba: Llama-style pre-norm blocks whose sequence mixer is a Mamba-1 scan or, every ``attn_layer_period`` blocks, softmax attention.

Each block holds one mixer (``mamba`` -> ``linear_attn``, or ``self_attn``)
and one feed-forward (``feed_forward`` -> ``mlp``), a plain MLP or, every
``expert_layer_period`` blocks, a mixture of experts whose router is the
standard one (a softmax over every expert, the top-k weights left
unnormalized), so ``Moe`` serves it as it is. Like Falcon-Mamba's,
the mixer norms B, C and the step size before the scan, and the values are
the normed ones.
"""

from transformers.models.jamba import modeling_jamba as MODELING

from nnterp import Layer, Mlp, Moe
from nnterp_attention.attention import Attention
from nnterp_mamba.selective_scan import SelectiveScan

MODEL_TYPES = ("jamba",)
ENVOYS = {
    MODELING.JambaAttentionDecoderLayer: Layer,
    MODELING.JambaMambaDecoderLayer: Layer,
    MODELING.JambaAttention: Attention,
    MODELING.JambaMambaMixer: SelectiveScan,
    MODELING.JambaMLP: Mlp,
    MODELING.JambaSparseMoeBlock: Moe,
}
RENAME = {
    "mamba": "linear_attn",
    "feed_forward": "mlp",
    "pre_ff_layernorm": "post_attention_layernorm",
    "model.final_layernorm": "ln_final",
}
# Four blocks cover every kind: mixer + MLP (0, 2), attention + experts (1), mixer + experts (3).
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    mamba_d_state=4,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_dt_rank=4,
    attn_layer_period=4,
    attn_layer_offset=1,
    expert_layer_period=2,
    expert_layer_offset=1,
    num_experts=4,
    num_experts_per_tok=2,
)
