"""Falcon-H1: a parallel hybrid. Every block runs a Mamba-2 mixer and softmax attention side by side on one norm's output, then an MLP.

``h = input_layernorm(x)``; the block adds ``mamba(h) * ssm_out_multiplier``
and ``self_attn(h * attention_in_multiplier) * attention_out_multiplier`` to
the stream, then ``feed_forward(pre_ff_layernorm(.))``. The two sequence
mixers' contributions are the scaled outputs, read where the block's forward
scales them, so::

    layer_input + linear_attn.attention_output + self_attn.attention_output + mlp.mlp_output == layer_output

and ``layer_mid`` (what ``pre_ff_layernorm`` reads) is ``layer_input`` plus
both. The mixer is read before the attention: the block runs it first.
"""

from __future__ import annotations

from transformers.models.falcon_h1 import modeling_falcon_h1 as MODELING

from nnterp import Mlp, TupleLayer
from nnterp.components.per_token import ChunkBoundaries
from nnterp_attention import Attention
from nnterp_ssd.blocks import SourcedLayer
from nnterp_ssd.state_space import StateSpace


class FalconH1Layer(SourcedLayer, TupleLayer):
    """Falcon-H1's block: instrumented at build (the contributions are operations in its forward); returns a 1-tuple."""

    RETURNED = 1


class FalconH1StateSpace(StateSpace):
    """Falcon-H1's Mamba-2 mixer, at ``layers[i].mamba``; its chunk size comes from ``config.mamba_chunk_size``."""

    PER_TOKEN = ChunkBoundaries("mamba_chunk_size")
    # the block scales the mixer's output by ssm_out_multiplier before adding it
    CONTRIBUTION = "../source.mamba_hidden_states_1.output"


class FalconH1Attention(Attention):
    """Falcon-H1's softmax attention, beside the mixer."""

    # the block scales the attention's output by attention_out_multiplier before adding it
    CONTRIBUTION = "../source.attention_hidden_states_0.output"


MODEL_TYPES = ("falcon_h1",)
#: The block runs its mixer before its attention (the conformance suites read them in this order).
CONTRIBUTIONS = (("linear_attn", "attention_output"), ("self_attn", "attention_output"), ("mlp", "mlp_output"))
ENVOYS = {
    MODELING.FalconH1DecoderLayer: FalconH1Layer,
    MODELING.FalconH1Mixer: FalconH1StateSpace,
    MODELING.FalconH1Attention: FalconH1Attention,
    MODELING.FalconH1MLP: Mlp,
}
RENAME = {
    "mamba": "linear_attn",
    "feed_forward": "mlp",
    "pre_ff_layernorm": "post_attention_layernorm",
    "model.final_layernorm": "ln_final",
}
# Multipliers other than 1, so the identity checks that each contribution is the scaled output.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    mamba_d_ssm=32,
    mamba_n_heads=4,
    mamba_d_head=8,
    mamba_n_groups=2,
    mamba_d_state=4,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_chunk_size=4,
    ssm_in_multiplier=1.3,
    ssm_out_multiplier=0.7,
    attention_in_multiplier=0.9,
    attention_out_multiplier=0.5,
)
