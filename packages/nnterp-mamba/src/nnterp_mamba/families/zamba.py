"""Zamba: Mamba-1 blocks, and hybrid blocks where a shared transformer feeds the mixer's input.

A Mamba block is ``x + mamba(input_layernorm(x))``. A hybrid block first runs
the shared transformer (attention and MLP over ``x`` concatenated with the
embeddings; every hybrid block's copy has the same weights) and projects it
(``linear``) to ``t``, then is ``x + mamba(input_layernorm(x + t))``, as on
Zamba2: the transformer reaches the stream only through the mixer's input. So
on both kinds ``layer_input + linear_attn.attention_output == layer_output``
(``CONTRIBUTIONS``), and the hybrid block's attention is ``layers[i].self_attn``,
whose ``attention_output`` is what it hands the shared transformer's MLP.

The mixer splits its channels into ``n_mamba_heads`` heads and calls the scan
once per head, in a loop: its scan values are served where that is one call
(``n_mamba_heads=1``) and say why not otherwise (``CALLS_PER_FORWARD``).
"""

from transformers.models.zamba import modeling_zamba as MODELING

from nnterp_attention.attention import Attention
from nnterp_mamba.blocks import MambaLayer
from nnterp_mamba.selective_scan import SelectiveScan


class ZambaScan(SelectiveScan):
    """Zamba's mixer: a Mamba-1 scan per Mamba head, ``n_mamba_heads`` calls per forward."""

    CALLS_PER_FORWARD = "n_mamba_heads"


MODEL_TYPES = ("zamba",)
ENVOYS = {
    MODELING.ZambaMambaDecoderLayer: MambaLayer,
    MODELING.ZambaHybridLayer: MambaLayer,
    MODELING.ZambaAttention: Attention,
    MODELING.ZambaMambaMixer: ZambaScan,
}
RENAME = {
    "mamba": "linear_attn",
    "mamba_decoder.mamba": "linear_attn",
    "mamba_decoder.input_layernorm": "input_layernorm",
    "shared_transf.self_attn": "self_attn",
    "model.final_layernorm": "ln_final",
}
# Only the mixer adds to the stream: the shared transformer's attention and MLP reach it through the mixer's input.
CONTRIBUTIONS = (("linear_attn", "attention_output"),)
# Blocks 2 and 3 are hybrid (transformers ties the shared transformer's weights across at least two); one Mamba head,
# so one scan call per forward; initializer_range five times the default, so that a written state shows in later tokens.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=4,
    attn_layer_period=2,
    attn_layer_offset=0,
    num_attention_heads=2,
    num_key_value_heads=1,
    mamba_d_state=4,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_dt_rank=4,
    n_mamba_heads=1,
    initializer_range=0.1,
)
