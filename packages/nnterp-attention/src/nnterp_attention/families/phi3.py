"""Phi-3: a Llama block with fused projections and a dropout on each sublayer's way into the stream.

The queries, keys and values are slices of one ``qkv_proj`` output, and the
MLP's gate and up halves are chunks of one ``gate_up_proj`` output;
``act_fn`` is Phi-3's ``activation_fn``. What the block adds is each
sublayer's output after its residual dropout (``resid_attn_dropout``,
``resid_mlp_dropout``), so the contributions are read there: the same tensor
as the module's output in eval mode, and still what reaches the stream in
training mode.
"""

from typing import Any

from transformers.models.phi3 import modeling_phi3 as MODELING

from nnterp import EProperty, Layer, Mlp
from nnterp.layouts import Residual
from nnterp_attention.attention import Attention


class Phi3Attention(Attention):
    @EProperty("../resid_attn_dropout.output")
    def attention_output(self, value: Any) -> Residual:
        """What the attention adds to the residual stream, after the block's dropout, [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value


class Phi3Mlp(Mlp):
    @EProperty("../resid_mlp_dropout.output")
    def mlp_output(self, value: Any) -> Residual:
        """What the MLP adds to the residual stream, after the block's dropout, [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value


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
