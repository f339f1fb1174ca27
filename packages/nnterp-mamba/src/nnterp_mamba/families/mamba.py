"""Mamba: every block is a norm and a Mamba-1 mixer (``backbone.layers.i.mixer``)."""

from transformers.models.mamba import modeling_mamba as MODELING

from nnterp_mamba.blocks import MambaLayer
from nnterp_mamba.selective_scan import SelectiveScan

MODEL_TYPES = ("mamba",)
ENVOYS = {
    MODELING.MambaBlock: MambaLayer,
    MODELING.MambaMixer: SelectiveScan,
}
RENAME = {
    "backbone.layers": "layers",
    "backbone.embeddings": "embed_tokens",
    "backbone.norm_f": "ln_final",
    "mixer": "linear_attn",
    "norm": "input_layernorm",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    state_size=4,
    num_hidden_layers=2,
    expand=2,
    conv_kernel=4,
)
