"""GPT-2: Conv1D projections, a fused query/key/value projection, and its own spellings.

The block is pre-norm (``ln_1``, ``ln_2``), with ``attn`` as ``self_attn``,
the MLP's ``c_proj`` as ``down_proj`` and ``act`` as ``act_fn``. Its Conv1D
weights are ``[in, out]``, which ``Mlp.intermediate_size`` reads as such.

GPT-2 has its own ``eager_attention_forward``, with the same operations the
shared one has (``nn_functional_softmax_0``, then ``nn_functional_dropout_0``)
and no repeat of keys and values. Two things differ:

- With ``reorder_and_upcast_attn`` the eager path skips the attention
  interface for the module's own ``_upcast_and_reordered_attn``, so the
  values read inside the interface are unavailable there (``REORDERED``);
  ``attention_output`` is not.
- The queries are a view of a piece ``split`` cut from one ``c_attn``
  output, and torch refuses an in-place edit of such a view while the graph
  records gradients: assign ``attention_queries`` rather than editing it in
  place. The keys and values are such views too when no cache copies them (a
  trace with ``use_cache=False``), so assign those as well.
  ``attention_head_outputs`` is a plain transposed view and takes both.
"""

from transformers.models.gpt2 import modeling_gpt2 as MODELING

from nnterp import Layer, Mlp
from nnterp_attention.attention import Attention

REORDERED = (
    "the model is configured with reorder_and_upcast_attn, whose eager attention runs GPT-2's own "
    "_upcast_and_reordered_attn instead of the attention interface; load it with reorder_and_upcast_attn=False"
)


class GPT2Attention(Attention):
    def off_interface(self) -> str | None:
        """Why the eager attention interface does not run here: another implementation, or the reordered path."""
        reason = super().off_interface()
        if reason is None and self._module.reorder_and_upcast_attn:
            return REORDERED
        return reason


MODEL_TYPES = ("gpt2",)
ENVOYS = {
    MODELING.GPT2Block: Layer,
    MODELING.GPT2Attention: GPT2Attention,
    MODELING.GPT2MLP: Mlp,
}
RENAME = {
    "transformer.h": "layers",
    "transformer.wte": "embed_tokens",
    "transformer.ln_f": "ln_final",
    "attn": "self_attn",
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "mlp.c_proj": "mlp.down_proj",
    "act": "act_fn",
}
TINY_CONFIG = dict(
    vocab_size=64,
    n_embd=32,
    n_layer=2,
    n_head=4,
    n_inner=64,
    n_positions=64,
)
