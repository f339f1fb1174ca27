"""Phi-3: a Llama block with fused projections and a dropout on each sublayer's way into the stream.

The queries, keys and values are slices of one ``qkv_proj`` output, and the
MLP's gate and up halves are chunks of one ``gate_up_proj`` output;
``act_fn`` is Phi-3's ``activation_fn``. What the block adds is each
sublayer's output after its residual dropout (``resid_attn_dropout``,
``resid_mlp_dropout``), so the contributions are read there: the same tensor
as the module's output in eval mode, and still what reaches the stream in
training mode.
"""

from transformers.models.phi3 import modeling_phi3 as MODELING

from nnterp import Layer, Mlp
from nnterp_attention.attention import Attention


class Phi3Attention(Attention):
    CONTRIBUTION = "../resid_attn_dropout.output"


class Phi3Mlp(Mlp):
    CONTRIBUTION = "../resid_mlp_dropout.output"


MODEL_TYPES = ("phi3",)
ENVOYS = {
    MODELING.Phi3DecoderLayer: Layer,
    MODELING.Phi3Attention: Phi3Attention,
    MODELING.Phi3MLP: Phi3Mlp,
}
RENAME = {"activation_fn": "act_fn"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
