"""BERT as a causal LM: a post-norm block whose sublayers end in modules that add the residual and normalize.

The block runs ``attention`` (``self``, the softmax attention, then
``output``: a projection, a dropout, and ``LayerNorm(out + stream)``), then
``intermediate`` (the MLP's up-projection and activation) and ``output`` (its
down-projection, a dropout, and ``LayerNorm(out + stream)``). So the stream is
normalized right after each addition, and::

    layer_output == output.LayerNorm(attention.output.LayerNorm(layer_input + attention_output) + mlp_output)

``self_attn`` is ``attention.self``, which calls transformers' attention
interface; what it adds (``attention_output``) is read after the dropout that
follows its output projection, ``attention.output.dense``. ``mlp`` is
``intermediate``: its input is the stream between the sublayers, its output
the neurons, and what it adds (``mlp_output``) is read after the dropout that
follows ``output.dense``. ``layer_mid`` is the first norm's output, which both
the MLP and its residual read, so a write there reaches both. There is no
final norm on the stream: ``lm_head`` is the whole head (``cls``), a
transform with its own norm, then the decoder. nnsight keeps ``.output`` for a
module's output, so it serves the children named ``output`` as ``E_output``
(``layers[i].E_output`` is ``BertOutput``), and the values are keyed there.

Transformers copies this block into many families (RoBERTa, ELECTRA, ERNIE,
...): each is a module naming its own classes with :func:`envoys_of`. A
checkpoint must be configured ``is_decoder=True`` to attend causally; without
it the model attends both ways, and values at a position depend on later
tokens.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import transformers
from packaging.version import Version
from transformers.models.bert import modeling_bert as MODELING

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP, EProperty, Layer, Mlp, TupleLayer, unavailable
from nnterp.layouts import Neurons, Residual
from nnterp_attention.attention import Attention
from nnterp_attention.own_arithmetic import OwnArithmeticAttention

#: Before transformers 5.20 RemBERT, BigBird and Megatron-BERT build a bidirectional mask even configured
#: ``is_decoder=True``: every token attends to later ones, and the suites' causal checks do not apply.
DECODER_ATTENDS_BOTH_WAYS = Version(transformers.__version__) < Version("5.20")


class BertLayer(Layer):
    def stream_norms(self) -> tuple[str, str]:
        """The norms of the stream after each addition, inside the attention's and the MLP's output modules."""
        return ("attention.output.LayerNorm", "output.LayerNorm")

    attention_norm_output = unavailable(POST_NORM_ATTENTION)
    mlp_norm_output = unavailable(POST_NORM_MLP)

    @EProperty("attention.E_output.LayerNorm.output")
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size]: the first norm's output.

        The MLP reads it and adds its output to it. Assign or edit in place.
        """
        return value


class PreNormBertLayer(Layer):
    """BERT's block with a norm in front of each sublayer instead of after each addition (Megatron-BERT, ...).

    The stream is added to as it is, so the contributions add up to
    ``layer_output``. The family names its two norms, relative to the block:
    ``ATTENTION_NORM`` and ``MLP_NORM`` (which may sit inside the MLP module).
    """

    ATTENTION_NORM: ClassVar[str]
    MLP_NORM: ClassVar[str]

    @EProperty(lambda layer: f"{layer.ATTENTION_NORM}.output")
    def attention_norm_output(self, value: Any) -> Residual:
        """What the attention is called with: its pre-norm's output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value

    @EProperty("attention.output", select=0)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size]: what ``attention`` returns.

        The MLP's norm reads it and the MLP's output is added to it, so a
        write reaches both. Assign or edit in place.
        """
        return value

    @EProperty(lambda layer: f"{layer.MLP_NORM}.output")
    def mlp_norm_output(self, value: Any) -> Residual:
        """The MLP's pre-norm output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value


class TupleBertLayer(BertLayer, TupleLayer):
    """BERT's block as it was before it returned its hidden states alone (RemBERT, Megatron-BERT): with the pattern."""


class BertAttention(Attention):
    CONTRIBUTION = "../E_output.dropout.output"


class ClassicBertAttention(OwnArithmeticAttention, BertAttention):
    """BERT's attention as it was before the shared interface (RemBERT, BigBird, GIT, Megatron-BERT): its own products.

    The queries, keys and values where the forward lays them out by head
    (its three ``transpose`` calls, before the cache update: on a decode step
    the step's own), the scores at the softmax, the pattern at its
    ``dropout``, the head outputs at the product with the values.
    """

    QUERIES = "source.transpose_0.output"
    KEYS = "source.transpose_1.output"
    VALUES = "source.transpose_2.output"
    SCORES = "source.nn_functional_softmax_0.input"
    PATTERN = "dropout.output"
    HEAD_OUTPUTS = "source.torch_matmul_1.output"


class BertMlp(Mlp):
    CONTRIBUTION = "../E_output.dropout.output"

    @property
    def intermediate_size(self) -> int:
        """Width of the MLP's hidden layer: the up-projection's output width."""
        return self._module.dense.out_features

    @EProperty("../E_output.dense.input")
    def mlp_neurons(self, value: Any) -> Neurons:
        """The neurons the down-projection (``output.dense``) sums, [batch, seq, intermediate_size]: the activation's output.

        Assign or edit in place.
        """
        return value


def envoys_of(
    modeling: ModuleType,
    prefix: str,
    layer: type = BertLayer,
    attention: type = BertAttention,
    mlp: type = BertMlp,
) -> dict[type, type]:
    """The standard envoys of a family that copies BERT's block, keyed on its classes named ``prefix`` + BERT's."""
    return {
        getattr(modeling, f"{prefix}Layer"): layer,
        getattr(modeling, f"{prefix}SelfAttention"): attention,
        getattr(modeling, f"{prefix}Intermediate"): mlp,
    }


MODEL_TYPES = ("bert",)
ENVOYS = envoys_of(MODELING, "Bert")
RENAME = {
    "*.encoder.layer": "layers",
    "*.embeddings.word_embeddings": "embed_tokens",
    "attention.self": "self_attn",
    "intermediate": "mlp",
    "intermediate_act_fn": "act_fn",
    "cls": "lm_head",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    is_decoder=True,
)
