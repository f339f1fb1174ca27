"""Bamba: pre-norm blocks whose sequence mixer is a Mamba-2 mixer or softmax attention, each followed by an MLP."""

from transformers.models.bamba import modeling_bamba as MODELING

from nnterp import Mlp, TupleLayer
from nnterp.components.per_token import ChunkBoundaries
from nnterp_attention import Attention
from nnterp_ssd.state_space import StateSpace


class BambaStateSpace(StateSpace):
    """Bamba's Mamba-2 mixer, at ``layers[i].mamba``; its chunk size comes from ``config.mamba_chunk_size``."""

    PER_TOKEN = ChunkBoundaries("mamba_chunk_size")


MODEL_TYPES = ("bamba",)
ENVOYS = {
    MODELING.BambaDecoderLayer: TupleLayer,
    MODELING.BambaMixer: BambaStateSpace,
    MODELING.BambaAttention: Attention,
    MODELING.BambaMLP: Mlp,
}
RENAME = {
    "mamba": "linear_attn",
    "feed_forward": "mlp",
    "pre_ff_layernorm": "post_attention_layernorm",
    "model.final_layernorm": "ln_final",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    attn_layer_indices=[1],
    mamba_n_heads=4,
    mamba_d_head=8,
    mamba_n_groups=2,
    mamba_d_state=4,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_chunk_size=4,
)
