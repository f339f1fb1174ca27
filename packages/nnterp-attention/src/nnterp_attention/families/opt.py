"""OPT: BART's block, pre-norm or post-norm by the config, whose MLP runs on the tokens flattened.

``OPTDecoderLayer`` spells out its MLP (``fc1``, ``activation_fn``,
``fc2``) and flattens the stream to one row per token before it,
``reshape(-1, hidden_size)``, viewing the sum back to ``[batch, seq,
hidden_size]`` at the end. So every value read between the flattening and the
end (``mlp_input``, ``mlp_norm_output``, the pre-norm block's ``layer_mid``,
the MLP's) is served as a ``TokenEProperty``: this invoke's ``[batch, seq,
...]`` view of the flat tensor, an assignment spliced back into it. Then
``layer_input + attention_output + mlp_output == layer_output`` holds as the
block computes it.

``do_layer_norm_before`` picks the layout per block (OPT-350m is post-norm):
pre-norm, ``self_attn_layer_norm`` and ``final_layer_norm`` in front of the
sublayers; post-norm, the same norms applied to the stream right after each
addition (``stream_norms``), with no pre-norm outputs.

The attention is the standard one. It scales the queries in the projection
(``q_proj(x) * scaling``) and calls the interface with ``scaling=1.0``, so the
served queries are the scaled ones and the scores their plain product with
the keys.
"""

from typing import Any

from transformers.models.opt import modeling_opt as MODELING

from nnterp import TokenEProperty
from nnterp.forward_source import Call, Place
from nnterp.layouts import Neurons, Residual
from nnterp_attention.attention import Attention
from nnterp_attention.block_layout import BlockLayout
from nnterp_attention.generic import GenericLayer, UnpackedMlp

_MLP = dict(attention="self_attn", mlp="fc2", attention_post_norm=None, mlp_post_norm=None, parallel=False)
_MLP.update(mlp_entry="fc1", mlp_activation="activation_fn")
#: The block with ``do_layer_norm_before``: each sublayer behind its norm.
PRE_NORM = BlockLayout(attention_norm="self_attn_layer_norm", mlp_norm="final_layer_norm", **_MLP)
#: The block without it: each sum normalized, the MLP reading the first norm's output.
POST_NORM = BlockLayout(
    attention_norm=None,
    mlp_norm=None,
    attention_stream_norm="self_attn_layer_norm",
    mlp_stream_norm="final_layer_norm",
    **_MLP,
)


def _on_tokens(cls: type, layout: type, *names: str) -> None:
    for name in names:
        setattr(cls, name, cls.values()[name].laid_out(layout, kind=TokenEProperty))


class OPTLayer(GenericLayer):
    """OPT's block, its layout read off the block's ``do_layer_norm_before``.

    ``layer_mid`` is read where the block flattens it, so that an assignment
    reaches both the MLP's side and the residual the MLP's output is added to
    (the block binds both to that one tensor); the forward is instrumented
    when built, as the place is an operation read after the block's input.
    """

    sourced = True

    @property
    def LAYOUT(self) -> BlockLayout:  # noqa: N802 - GenericLayer's name for the block's layout
        return PRE_NORM if self._module.do_layer_norm_before else POST_NORM

    @TokenEProperty(Place(Call("hidden_states.reshape")))
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size].

        On a post-norm block, the first norm's output. The block flattens it to
        one row per token; it is served as this invoke's rows. Assign or edit
        in place: both the MLP and the residual sum receive it.
        """
        return value


class OPTMlp(UnpackedMlp):
    """OPT's MLP at ``fc2``, its values over the flattened tokens served as ``[batch, seq, ...]``."""

    ACTIVATION = "activation_fn"


_on_tokens(OPTLayer, Residual, "mlp_norm_output", "mlp_input")
_on_tokens(OPTMlp, Residual, "mlp_output")
_on_tokens(OPTMlp, Neurons, "mlp_activation", "mlp_neurons")

MODEL_TYPES = ("opt",)
ENVOYS = {
    MODELING.OPTDecoderLayer: OPTLayer,
    MODELING.OPTAttention: Attention,
    "fc2": OPTMlp,
}
RENAME = {
    "model.decoder.layers": "layers",
    "model.decoder.embed_tokens": "embed_tokens",
    "model.decoder.final_layer_norm": "ln_final",
    "fc2": "mlp",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    ffn_dim=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    word_embed_proj_dim=32,
)
