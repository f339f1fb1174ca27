"""MPT: ALiBi, an attention that computes its pattern itself, and an MLP that adds the residual itself.

The block is pre-norm: ``norm_1``, ``attn`` and ``norm_2``, ``ffn`` are
``input_layernorm``, ``self_attn`` and ``post_attention_layernorm``, ``mlp``,
and the MLP's ``act`` is ``act_fn``. The block adds the attention's output
after its ``resid_attn_dropout``, read there; the MLP takes the residual as an
argument and returns ``dropout(out) + residual``, so its contribution is read
inside it, at that dropout (see ``nnterp_attention.blocks``).

The attention is read at its own operations. The queries, keys and values
where the forward splits them by head (after ``clip_qkv``'s clamp), before
the cache update: on a decode step the keys and values are the step's own,
without the cached ones, and a written key or value is what the cache keeps
for later steps. The scores at the softmax (in float32, the ALiBi bias and the
mask added), the pattern after the dropout, the head outputs at the product
with the values. With zero queries the pattern is the softmax of the ALiBi
bias over the causal keys, not uniform.

The queries, keys and values are views of pieces ``chunk`` cuts from one
``Wqkv`` output, read before any cache copies them, and torch refuses an
in-place edit of such a view while the graph records gradients: assign them
rather than editing them in place.
"""

from transformers.models.mpt import modeling_mpt as MODELING

from nnterp import TupleLayer
from nnterp_attention.blocks import InnerResidualMlp
from nnterp_attention.own_arithmetic import OwnArithmeticAttention


class MptAttention(OwnArithmeticAttention):
    CONTRIBUTION = "../resid_attn_dropout.output"
    QUERIES = "source.query_states_0.output"
    KEYS = "source.key_states_0.output"
    VALUES = "source.value_states_0.output"
    SCORES = "source.nn_functional_softmax_0.input"
    PATTERN = "source.nn_functional_dropout_0.output"
    HEAD_OUTPUTS = "source.torch_matmul_1.output"


class MptMlp(InnerResidualMlp):
    CONTRIBUTION = "source.F_dropout_0.output"


MODEL_TYPES = ("mpt",)
ENVOYS = {
    MODELING.MptBlock: TupleLayer,
    MODELING.MptAttention: MptAttention,
    MODELING.MptMLP: MptMlp,
}
RENAME = {
    "transformer.blocks": "layers",
    "transformer.wte": "embed_tokens",
    "transformer.norm_f": "ln_final",
    "attn": "self_attn",
    "ffn": "mlp",
    "norm_1": "input_layernorm",
    "norm_2": "post_attention_layernorm",
    "act": "act_fn",
}
TINY_CONFIG = dict(
    vocab_size=64,
    d_model=32,
    n_layers=2,
    n_heads=4,
    max_seq_len=64,  # the ALiBi bias is built this long on every forward
)
