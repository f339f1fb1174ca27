"""ZAYA: a pre-norm block whose two additions are learned per-channel affine sums, around a mixture of experts.

Each addition is a ``ZayaResidualScaling``: the sublayer's output and the
residual each shifted by a bias and scaled by a vector, then added. With
``S(out, res) = (out + hidden_states_bias) * hidden_states_scale
+ (res + residual_bias) * residual_scale``::

    layer_mid    = post_attention_residual_scale(attention_output, layer_input)
    layer_output = post_mlp_residual_scale(mlp_output, layer_mid)

so the plain sum holds only at the initial scales (ones) and biases (zeros).
``layer_mid`` is the first scaling's output, the residual the block normalizes
for the MLP and hands the second scaling: an assignment replaces it for both.
The model keeps the residual stream in float32 whatever its dtype, and the
stream entering the first block is the embeddings shifted and scaled
(``input_hidden_states_bias``, ``input_hidden_states_scale``).

The attention (compressed convolutional attention) makes its queries and keys
with a causal convolution over projections, L2-normalizes them to
``sqrt(head_dim)``, scales the keys by a learned number per key head
(``qk_norm.temp``, zero at initialization: uniform patterns) and rotates part
of each head; half of each value head is projected from the previous token.
It then calls the shared eager function, where the standard values are read.

The mixture's router (``gate`` -> ``router``) scores ``num_experts + 1``
classes, the last a skip expert that computes nothing: it projects the
block's input down, adds the previous block's router state scaled per
channel (``router_states_scale``, from the second block on), and runs a small
MLP (``router_mlp``) whose output is ``router_logits``. A softmax over the
classes is chosen from with ``balancing_biases`` added (a selection bias) and
weighs unrenormalized; a slot that chose the skip expert reaches the experts
as expert 0 with weight zero. The block returns the router state it made
beside the stream, for the next block.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from transformers.models.zaya import modeling_zaya as MODELING

from nnterp import EProperty, Layer, Moe, Scoring, TokenEProperty, TupleLayer, mixture_reason
from nnterp.layouts import BATCH, SEQ, Residual
from nnterp_attention.attention import Attention

#: The block's two additions, in the forward's order: the attention's, then the MLP's.
RESIDUAL_SCALINGS = ("post_attention_residual_scale", "post_mlp_residual_scale")
#: The classes the router scores: the routed experts and the skip expert after them.
ROUTER_CLASSES = "router_classes"
RouterClasses = Float[Tensor, f"{BATCH} {SEQ} {ROUTER_CLASSES}"]


class ZayaLayer(TupleLayer):
    """ZAYA's block: ``layer_mid`` is the first scaled sum, and the block returns its router state beside the stream."""

    @EProperty("post_attention_residual_scale.output")
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size]: the first scaled sum.

        ``post_attention_residual_scale(attention_output, layer_input)``. Assign
        or edit in place: both the MLP's norm and the second scaling receive it.
        """
        return value

    def stream_after_adding(self, index: int, stream: Any, contribution: Any) -> Any:
        """The block's scaled sum for that addition (``RESIDUAL_SCALINGS``) of ``contribution`` and ``stream``."""
        with torch.no_grad():
            return getattr(self._module, RESIDUAL_SCALINGS[index])(contribution, stream)

    def skip(self, hidden: Any) -> None:
        """Skip this block: ``hidden`` takes the place of its ``layer_output``, the router state it was given passes on.

        The next block's router then adds the state this block received, as
        if the block had passed it through (the first block receives none).
        """
        Layer.skip(self, (hidden, self.inputs[0][1]))


class ZayaMoe(Moe):
    """ZAYA's mixture: softmax over the experts and a skip expert, chosen with a selection bias, not renormalized."""

    SCORING = Scoring(bias="balancing_biases")
    LOGITS = "router_mlp.output"

    @TokenEProperty(lambda moe: f"{moe.ROUTER}.{moe.LOGITS}", unavailable=mixture_reason)
    def router_logits(self, value: Any) -> RouterClasses:
        """The router's logits, [batch, seq, router_classes]: the routed experts', then the skip expert's.

        ``router_mlp``'s output, before the softmax and the selection bias.
        Assign or edit in place: the router scores what is written.
        """
        return value

    @property
    def router_classes(self) -> int:
        """What the router scores: the routed experts, then the skip expert (``num_experts + 1``)."""
        return self.router_module().num_router_classes

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The scoring's routing, a slot that chose the skip expert sent to expert 0 with weight zero, as the router does."""
        indices, weights = super().route(logits)
        skipped = indices == self.num_experts
        indices, weights = indices.masked_fill(skipped, 0), weights.masked_fill(skipped, 0)
        order = indices.argsort(-1)
        return indices.gather(-1, order), weights.gather(-1, order)


def tiny_weights(model: Any) -> None:
    """Give the tiny model's key scales random values: ZAYA initializes them to zero, which zeroes every key."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            temp = layer.self_attn.qk_norm.temp
            temp.copy_(torch.rand(temp.shape, generator=generator) + 0.5)


MODEL_TYPES = ("zaya",)
ENVOYS = {
    MODELING.ZayaDecoderLayer: ZayaLayer,
    MODELING.ZayaAttention: Attention,
    MODELING.ZayaSparseMoeBlock: ZayaMoe,
}
RENAME = {MODELING.ZayaRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=1,  # the only count ZAYA's config accepts
    router_hidden_size=16,
    max_position_embeddings=64,
)
