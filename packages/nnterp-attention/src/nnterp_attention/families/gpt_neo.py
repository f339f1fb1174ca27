"""GPT-Neo: GPT-2's block around an attention that computes its pattern itself, global or local by layer.

The block is pre-norm (``ln_1``, ``ln_2``) and returns a tuple. Its ``attn``
is a wrapper whose child ``attention`` is the attention proper, aliased as
``self_attn``; the MLP's ``c_proj`` is ``down_proj`` and ``act`` is
``act_fn``.

``config.attention_types`` makes each layer ``global`` (causal) or ``local``:
the causal mask narrowed to the last ``window_size`` keys, a buffer of the
module (``bias``) the forward applies with ``torch.where`` before the
softmax. The scores are not scaled by ``1/sqrt(head_dim)``: they are the plain
product of the queries and keys, in float32.

The attention is read at its own operations, located by what they are in the
installed forward: the queries, keys and values as the forward hands them to
``_attn`` (laid out by head, after the cache update: on a decode step the keys
and values include the cached ones), the scores at ``_attn``'s softmax (masked,
in float32), the pattern after its ``attn_dropout``, the head outputs as
``_attn`` returns them. Under flash attention the module is another class,
which this family does not read.
"""

from transformers.models.gpt_neo import modeling_gpt_neo as MODELING

from nnterp import Mlp, TupleLayer
from nnterp.forward_source import Call, ForwardSource
from nnterp_attention.own_arithmetic import OwnArithmeticAttention

#: nnsight's labels of the call of ``_attn`` in the forward and of the softmax inside ``_attn``, in this transformers.
ATTN = ForwardSource.of(MODELING.GPTNeoSelfAttention.forward).find(Call("self._attn")).label
SOFTMAX = ForwardSource.of(MODELING.GPTNeoSelfAttention._attn).find(Call("nn.functional.softmax")).label


class GPTNeoAttention(OwnArithmeticAttention):
    QUERIES = f"source.{ATTN}.inputs"
    KEYS = f"source.{ATTN}.inputs"
    VALUES = f"source.{ATTN}.inputs"
    SCORES = f"source.{ATTN}.source.{SOFTMAX}.input"
    PATTERN = "attn_dropout.output"
    HEAD_OUTPUTS = f"source.{ATTN}.output"
    ELEMENTS = {"QUERIES": 0, "KEYS": 1, "VALUES": 2, "HEAD_OUTPUTS": 0}

    @property
    def window(self) -> int | None:
        """How many keys each query of a ``local`` layer sees (itself included); ``None`` on a ``global`` layer."""
        module = self._module
        return module.config.window_size if module.attention_type == "local" else None


MODEL_TYPES = ("gpt_neo",)
ENVOYS = {
    MODELING.GPTNeoBlock: TupleLayer,
    MODELING.GPTNeoSelfAttention: GPTNeoAttention,
    MODELING.GPTNeoMLP: Mlp,
}
RENAME = {
    "transformer.h": "layers",
    "transformer.wte": "embed_tokens",
    "transformer.ln_f": "ln_final",
    "attn.attention": "self_attn",
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "mlp.c_proj": "mlp.down_proj",
    "act": "act_fn",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    attention_types=[[["global", "local"], 1]],
    window_size=32,
    max_position_embeddings=64,
)
