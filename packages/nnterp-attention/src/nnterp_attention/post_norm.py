"""Blocks that normalize a sublayer's output before adding it to the residual stream.

Gemma-2/3 wrap each sublayer in a pair of norms (the "sandwich": a pre-norm in
front, a post-norm after); OLMo-2 keeps only the norm after. Either way what the
block adds to the stream is the post-norm's output, not the sublayer's, so
``attention_output`` and ``mlp_output`` are read there, and the identity
``layer_input + attention_output + mlp_output == layer_output`` holds.

These blocks spell their norms ``post_attention_layernorm`` (after the
attention) and ``post_feedforward_layernorm`` (after the MLP): on them
``post_attention_layernorm`` is the attention's post-norm, not the MLP's
pre-norm it is on Llama, so the name cannot be aliased to its Llama meaning.
"""

from __future__ import annotations

from typing import Any

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP, EProperty, Layer, Mlp, unavailable
from nnterp.layouts import Residual

from .attention import Attention


class PostNormAttention(Attention):
    """An attention whose output the block normalizes before adding it: its contribution is the post-norm's output."""

    CONTRIBUTION = "../post_attention_layernorm.output"


class PostNormMlp(Mlp):
    """An MLP whose output the block normalizes before adding it: its contribution is the post-norm's output."""

    CONTRIBUTION = "../post_feedforward_layernorm.output"


class SandwichLayer(Layer):
    """A block with a norm before and after each sublayer (Gemma-2/3).

    The MLP's pre-norm is ``pre_feedforward_layernorm``; the stream between
    the sublayers is what it is called with.
    """

    @EProperty("pre_feedforward_layernorm.input", shared=True)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size]: the MLP's pre-norm's input.

        Assign or edit in place.
        """
        return value

    @EProperty("pre_feedforward_layernorm.output")
    def mlp_norm_output(self, value: Any) -> Residual:
        """The MLP's pre-norm output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value


class PostNormLayer(Layer):
    """A block with a norm only after each sublayer (OLMo-2): the sublayers read the stream itself."""

    attention_norm_output = unavailable(POST_NORM_ATTENTION)
    mlp_norm_output = unavailable(POST_NORM_MLP)

    @EProperty("mlp.input", shared=True)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size]: what the MLP is called with.

        Assign or edit in place.
        """
        return value
