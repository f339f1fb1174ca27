"""CPM-Ant: a pre-norm block made of two sub-blocks, each holding its own norm and residual addition.

``CpmAntTransformerBlock`` calls ``self_att`` (``layernorm_before_attention``
-> ``input_layernorm``, the attention, ``+`` the block's input) and then
``ffn`` (``layernorm_before_ffn`` -> ``post_attention_layernorm``, the
gated feed-forward ``ffn.ffn`` -> ``mlp``, ``+`` its input). So::

    layer_mid    = layer_input + attention_output
    layer_output = layer_mid + mlp_output

``layer_mid`` is what ``self_att`` returns and ``ffn`` is called with: an
assignment replaces it for the MLP's norm and the residual alike.

The model runs its blocks on ``prompt_length`` learned prompt tokens put in
front of the input, so every block value has ``prompt_length`` more
positions than the input (the model drops them after the final norm). The
prompt is not masked: the first forward attends in both directions, over the
prompt and every input token; a decode step attends to what is cached.

The attention computes its pattern itself: scaled query-key products plus a
relative position bias per head (bucketed distance, computed once in the
model and handed to every block), masked, softmax, masked again (rows
wholly masked are zero), then the product with the values. Its values are
read at those operations: the queries and keys as the first product takes
them (after the cache update: on a decode step the keys include the cached
ones), the values and the pattern as the second product takes them.
"""

from typing import Any

from transformers.models.cpmant import modeling_cpmant as MODELING

from nnterp import EProperty, Mlp, TupleLayer
from nnterp.forward_source import ForwardSource
from nnterp.layouts import Keys, Residual
from nnterp_attention.own_arithmetic import OwnArithmeticAttention

#: nnsight's labels of the two products in the attention's forward: queries with keys, then pattern with values.
SCORE_PRODUCT, VALUE_PRODUCT = (
    op.label for op in ForwardSource.of(MODELING.CpmAntAttention.forward).calls("torch.matmul")
)


class CpmAntLayer(TupleLayer):
    """CPM-Ant's block: ``layer_mid`` is the attention sub-block's sum, which the MLP sub-block takes."""

    @EProperty("self_att.output")
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sub-blocks, [batch, seq, hidden_size]: ``layer_input + attention_output``.

        Assign or edit in place: the MLP's sub-block normalizes it and adds its output to it.
        """
        return value


class CpmAntAttention(OwnArithmeticAttention):
    QUERIES = f"source.{SCORE_PRODUCT}.inputs"
    KEYS = f"source.{SCORE_PRODUCT}.inputs"
    VALUES = f"source.{VALUE_PRODUCT}.inputs"
    SCORES = "softmax.input"
    PATTERN = f"source.{VALUE_PRODUCT}.inputs"
    HEAD_OUTPUTS = f"source.{VALUE_PRODUCT}.output"
    ELEMENTS = {"QUERIES": 0, "KEYS": 1, "VALUES": 1, "PATTERN": 0}

    @property
    def head_dim(self) -> int:
        """Width of one head's queries, keys and values: the module's ``dim_head``."""
        return self._module.dim_head

    @EProperty(KEYS, select=1)
    def attention_keys(self, value: Any) -> Keys:
        """The keys the scores are computed with, [batch, num_kv_heads, seq, qk_head_dim].

        The first product takes them transposed; they are served as a view laid
        out by position. Assign to replace them, or edit in place.
        """
        return value.transpose(-1, -2)

    @attention_keys.postprocess
    def attention_keys(self, value: Any) -> Any:
        return value.transpose(-1, -2)


def prefix_positions(config: Any) -> int:
    """How many positions the blocks run on before the input's tokens: the learned prompt's."""
    return config.prompt_length


#: The first forward attends over the prompt and the input in both directions (the suites' causal checks skip).
ATTENDS_BOTH_WAYS = True

MODEL_TYPES = ("cpmant",)
ENVOYS = {
    MODELING.CpmAntTransformerBlock: CpmAntLayer,
    MODELING.CpmAntAttention: CpmAntAttention,
    MODELING.CpmAntFeedForward: Mlp,
}
RENAME = {
    "cpmant.encoder.layers": "layers",
    "cpmant.input_embedding": "embed_tokens",
    "cpmant.encoder.output_layernorm": "ln_final",
    "self_att.self_attention": "self_attn",
    "self_att.layernorm_before_attention": "input_layernorm",
    "ffn.layernorm_before_ffn": "post_attention_layernorm",
    "ffn.ffn": "mlp",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    num_attention_heads=4,
    dim_head=8,
    dim_ff=64,
    num_hidden_layers=2,
    position_bias_num_buckets=32,
    position_bias_max_distance=64,
    prompt_types=3,  # the model prepends the third type's prompt
    prompt_length=2,
    segment_types=4,
    init_std=0.02,
)
