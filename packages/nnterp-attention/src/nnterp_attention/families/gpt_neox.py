"""GPT-NeoX (Pythia): a parallel block by default, and its own spellings.

With ``use_parallel_residual`` (the default) the attention and the MLP both
read the block's input, ``x + attn(ln1(x)) + mlp(ln2(x))``, so there is no
stream between them and ``layer_mid`` is unavailable (``PARALLEL``); without
it the block is sequential and ``layer_mid`` is what the MLP's pre-norm is
called with. What the block adds is each sublayer's output after its dropout
(``post_attention_dropout``, ``post_mlp_dropout``), read there.

The queries, keys and values are chunks of one ``query_key_value`` output.
The queries and keys leave the rotary embedding as new tensors and take
in-place edits. The values stay views of a ``chunk`` when no cache copies
them (a trace with ``use_cache=False``), and torch refuses an in-place edit
of such a view while the graph records gradients: assign
``attention_values`` rather than editing it in place.
"""

from typing import Any

from transformers.models.gpt_neox import modeling_gpt_neox as MODELING

from nnterp import PARALLEL, EProperty, Layer, Mlp
from nnterp.layouts import Residual
from nnterp_attention.attention import Attention


def parallel(layer: Layer) -> str | None:
    """Why this block has no stream between its sublayers, or ``None``."""
    return PARALLEL if layer._module.use_parallel_residual else None


class GPTNeoXLayer(Layer):
    @EProperty("post_attention_layernorm.input", unavailable=parallel, shared=True)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers of a sequential block, [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value


class GPTNeoXAttention(Attention):
    CONTRIBUTION = "../post_attention_dropout.output"


class GPTNeoXMlp(Mlp):
    CONTRIBUTION = "../post_mlp_dropout.output"


MODEL_TYPES = ("gpt_neox",)
ENVOYS = {
    MODELING.GPTNeoXLayer: GPTNeoXLayer,
    MODELING.GPTNeoXAttention: GPTNeoXAttention,
    MODELING.GPTNeoXMLP: GPTNeoXMlp,
}
RENAME = {
    "gpt_neox.layers": "layers",
    "gpt_neox.embed_in": "embed_tokens",
    "gpt_neox.final_layer_norm": "ln_final",
    "embed_out": "lm_head",
    "attention": "self_attn",
    "mlp.dense_4h_to_h": "mlp.down_proj",
    "act": "act_fn",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
)
