"""GPT-NeoX-Japanese: a pre-norm block that adds its sublayers through ``bias_dropout_add``, and an attention of its own arithmetic.

The block is pre-norm under Llama's norm names (``input_layernorm``,
``post_attention_layernorm``) and returns a tuple. It adds each sublayer with
the module-level ``bias_dropout_add(x, bias, residual, ...)``, which computes
``residual + dropout(x + bias)``: the attention returns its projection and,
on the last block alone, a bias (``dense_bias``) that only this call adds.
So what a sublayer adds is read inside its call, at the dropout
(``attention_output`` includes the bias), and
``layer_input + attention_output + mlp_output == layer_output`` holds on every
block. ``layer_mid`` is what ``post_attention_layernorm`` is called with, the
tensor the second call also adds to.

The attention (``attention``, aliased ``self_attn``) computes its pattern in
``_attn`` and is read there, as GPT-Neo's: the queries, keys and values as
the forward hands them to ``_attn`` (rotary applied, after the cache update:
on a decode step the keys and values include the cached ones), the scores at
its softmax (scaled by ``1/sqrt(head_size)``, the mask added), the pattern
after ``attention_dropout``, the head outputs as ``_attn`` returns them. The
MLP's ``dense_4h_to_h`` is ``down_proj`` and ``act`` is ``act_fn``.
"""

from transformers.models.gpt_neox_japanese import modeling_gpt_neox_japanese as MODELING

from nnterp import Mlp, TupleLayer
from nnterp.forward_source import Call, ForwardSource
from nnterp_attention.own_arithmetic import OwnArithmeticAttention

_BLOCK = ForwardSource.of(MODELING.GPTNeoXJapaneseLayer.forward)
_ATTENTION = ForwardSource.of(MODELING.GPTNeoXJapaneseAttention.forward)
#: nnsight's labels, in this transformers, of the block's two ``bias_dropout_add`` calls (the attention's, the MLP's).
ADD_ATTENTION, ADD_MLP = (operation.label for operation in _BLOCK.calls("bias_dropout_add"))
#: The dropout inside ``bias_dropout_add``, whose output is what the call adds to the residual.
DROPOUT = ForwardSource.of(MODELING.bias_dropout_add).find(Call("torch.nn.functional.dropout")).label
#: The call of ``_attn`` in the attention's forward, and the softmax inside ``_attn``.
ATTN = _ATTENTION.find(Call("self._attn")).label
SOFTMAX = ForwardSource.of(MODELING.GPTNeoXJapaneseAttention._attn).find(Call("nn.functional.softmax")).label


class GPTNeoXJapaneseLayer(TupleLayer):
    """The block, its forward instrumented when built: the contributions are operations of it, read after its input."""

    sourced = True


class GPTNeoXJapaneseAttention(OwnArithmeticAttention):
    CONTRIBUTION = f"../source.{ADD_ATTENTION}.source.{DROPOUT}.output"
    QUERIES = f"source.{ATTN}.inputs"
    KEYS = f"source.{ATTN}.inputs"
    VALUES = f"source.{ATTN}.inputs"
    SCORES = f"source.{ATTN}.source.{SOFTMAX}.input"
    PATTERN = "attention_dropout.output"
    HEAD_OUTPUTS = f"source.{ATTN}.output"
    ELEMENTS = {"QUERIES": 0, "KEYS": 1, "VALUES": 2, "HEAD_OUTPUTS": 0}


class GPTNeoXJapaneseMlp(Mlp):
    CONTRIBUTION = f"../source.{ADD_MLP}.source.{DROPOUT}.output"


MODEL_TYPES = ("gpt_neox_japanese",)
ENVOYS = {
    MODELING.GPTNeoXJapaneseLayer: GPTNeoXJapaneseLayer,
    MODELING.GPTNeoXJapaneseAttention: GPTNeoXJapaneseAttention,
    MODELING.GPTNeoXJapaneseMLP: GPTNeoXJapaneseMlp,
}
RENAME = {
    "gpt_neox_japanese.layers": "layers",
    "gpt_neox_japanese.embed_in": "embed_tokens",
    "gpt_neox_japanese.final_layer_norm": "ln_final",
    "embed_out": "lm_head",
    "attention": "self_attn",
    "mlp.dense_4h_to_h": "mlp.down_proj",
    "act": "act_fn",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_multiple_size=2,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
)
