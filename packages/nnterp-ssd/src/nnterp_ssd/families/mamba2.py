"""Mamba-2: a stack of single-sublayer blocks, x + mixer(norm(x)), every mixer a Mamba-2 one."""

from transformers.models.mamba2 import modeling_mamba2 as MODELING

from nnterp_ssd.blocks import NormMixerLayer
from nnterp_ssd.state_space import StateSpace

MODEL_TYPES = ("mamba2",)
ENVOYS = {
    MODELING.Mamba2Block: NormMixerLayer,
    MODELING.Mamba2Mixer: StateSpace,
}
RENAME = {
    "backbone.layers": "layers",
    "backbone.embeddings": "embed_tokens",
    "backbone.norm_f": "ln_final",
    "mixer": "linear_attn",
}
# num_heads * head_dim == expand * hidden_size; two groups so that B and C are shared by two heads each.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    num_heads=4,
    head_dim=8,
    state_size=4,
    n_groups=2,
    num_hidden_layers=2,
    expand=2,
    conv_kernel=4,
    chunk_size=4,
)
