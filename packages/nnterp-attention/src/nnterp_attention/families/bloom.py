"""BLOOM: ALiBi, an attention that computes its pattern itself, and sublayers that add the residual themselves.

The block is pre-norm under Llama's norm names, with ``self_attention`` as
``self_attn``, the MLP's ``dense_4h_to_h`` as ``down_proj`` and ``gelu_impl``
as ``act_fn``. Its attention and MLP take the residual as an argument and
return ``residual + dropout(out)`` through ``dropout_add``, so their
contributions are read inside that call, at its dropout (see
``nnterp_attention.blocks``).

The attention folds the heads into the batch axis for its products
(``alibi.baddbmm``, ``torch.bmm``). The queries, keys and values are read
where it folds them (``reshape``), after the cache update, so on a decode step
the keys and values include the cached ones and a write changes that step
alone; the scores at ``F.softmax`` (the ALiBi bias and the mask added), the
pattern at ``attention_dropout``, the head outputs at the ``bmm``. With zero
queries the pattern is the softmax of the ALiBi bias over the causal keys, not
uniform.

With ``apply_residual_connection_post_layernorm`` each sublayer's residual is
its pre-norm's output rather than the stream, and ``attention_output``,
``mlp_output`` and ``layer_mid`` are unavailable (``NORMED_RESIDUAL``).
"""

from typing import Any

from transformers.models.bloom import modeling_bloom as MODELING

from nnterp import EProperty, TupleLayer, contribution
from nnterp.layouts import Residual
from nnterp_attention.blocks import InnerResidualMlp
from nnterp_attention.own_arithmetic import OwnArithmeticAttention

NORMED_RESIDUAL = (
    "the model is configured with apply_residual_connection_post_layernorm: each sublayer adds its output to its "
    "pre-norm's output instead of the residual stream, so no contributions add up from layer_input to layer_output; "
    "read what a sublayer computes at its dropout_add call (self_attn.source.dropout_add_0.input, likewise on mlp), "
    "or load a checkpoint without the flag"
)
#: What a sublayer adds, inside ``dropout_add(out, residual, ...)``: ``out`` after its dropout.
ADDED = "source.dropout_add_0.source.F_dropout_0.output"


def normed_residual(envoy: Any) -> str | None:
    """Why the block ``envoy`` belongs to has no residual stream for its sublayers to add to, or ``None``."""
    block = envoy if isinstance(envoy, BloomLayer) else envoy.parent
    return NORMED_RESIDUAL if block._module.apply_residual_connection_post_layernorm else None


class BloomLayer(TupleLayer):
    @EProperty("post_attention_layernorm.input", unavailable=normed_residual, shared=True)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size]: the attention's output.

        Assign or edit in place.
        """
        return value


class BloomAttention(OwnArithmeticAttention):
    CONTRIBUTION = ADDED
    QUERIES = "source.query_layer_reshape_0.output"
    KEYS = "source.key_layer_reshape_0.output"
    VALUES = "source.value_layer_reshape_0.output"
    SCORES = "source.F_softmax_0.input"
    PATTERN = "attention_dropout.output"
    HEAD_OUTPUTS = "source.torch_bmm_0.output"
    HEADS_IN_BATCH = True

    @EProperty(contribution, unavailable=normed_residual)
    def attention_output(self, value: Any) -> Residual:
        """What the attention adds to the residual stream, [batch, seq, hidden_size], before ``dropout_add`` adds the stream.

        Assign or edit in place.
        """
        return value


class BloomMlp(InnerResidualMlp):
    CONTRIBUTION = ADDED

    @EProperty(contribution, unavailable=normed_residual)
    def mlp_output(self, value: Any) -> Residual:
        """What the MLP adds to the residual stream, [batch, seq, hidden_size], before ``dropout_add`` adds the stream.

        Assign or edit in place.
        """
        return value


MODEL_TYPES = ("bloom",)
ENVOYS = {
    MODELING.BloomBlock: BloomLayer,
    MODELING.BloomAttention: BloomAttention,
    MODELING.BloomMLP: BloomMlp,
}
RENAME = {
    "transformer.h": "layers",
    "transformer.word_embeddings": "embed_tokens",
    "transformer.ln_f": "ln_final",
    "self_attention": "self_attn",
    "mlp.dense_4h_to_h": "mlp.down_proj",
    "gelu_impl": "act_fn",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    n_layer=2,
    n_head=4,
)
