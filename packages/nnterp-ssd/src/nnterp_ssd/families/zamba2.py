"""Zamba2: Mamba-2 blocks, and hybrid blocks where a shared transformer block feeds the mixer's input.

A Mamba block is ``x + mamba(input_layernorm(x))``. A hybrid block first runs
the shared transformer (attention and MLP, one set of weights for every
hybrid block) on ``x`` and the embeddings, projects it (``linear``) to ``t``,
and is ``x + mamba(input_layernorm(x + t))``: the shared transformer reaches
the stream only through the mixer's input. So on both kinds
``layer_input + linear_attn.attention_output == layer_output``, and the
hybrid block's mixer is ``layers[i].linear_attn`` like any other. The shared
transformer stays under its own name (``layers[i].shared_transformer``); it
contributes nothing to the stream directly.
"""

from __future__ import annotations

from transformers.models.zamba2 import modeling_zamba2 as MODELING

from nnterp_ssd.blocks import MixerLayer
from nnterp_ssd.state_space import StateSpace

MODEL_TYPES = ("zamba2",)
ENVOYS = {
    MODELING.Zamba2MambaDecoderLayer: MixerLayer,
    MODELING.Zamba2HybridLayer: MixerLayer,
    MODELING.Zamba2MambaMixer: StateSpace,
}
RENAME = {
    "mamba": "linear_attn",
    "mamba_decoder.mamba": "linear_attn",
    "mamba_decoder.input_layernorm": "input_layernorm",
    "model.final_layernorm": "ln_final",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    num_hidden_layers=3,
    layers_block_type=["mamba", "hybrid", "mamba"],
    mamba_d_state=4,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_ngroups=2,
    n_mamba_heads=4,
    chunk_size=4,
    num_attention_heads=2,
    num_key_value_heads=2,
    intermediate_size=32,
    attention_head_dim=16,
)
