"""Gemma-4 Unified's text model: Gemma-4's block without the per-layer input or the mixture of experts.

A sandwich block (each sublayer read after its post-norm) whose whole stream
the buffer ``layer_scalar`` multiplies after the MLP's addition, so
``layer_output == layer_scalar * (layer_input + attention_output +
mlp_output)``. Its attention is Gemma-4's: full-attention blocks have their
own head width and key/value heads, and the last ``num_kv_shared_layers``
blocks attend over the keys and values of the last earlier block of their
type (see the ``gemma4_text`` family).
"""

from transformers.models.gemma4_unified import modeling_gemma4_unified as MODELING

from nnterp_attention.post_norm import PostNormAttention, PostNormMlp

from . import gemma4_text


class Gemma4UnifiedLayer(gemma4_text.Gemma4Layer):
    """Gemma-4's block with two additions: ``layer_scalar`` scales the stream after the MLP's."""

    def stream_norms(self) -> tuple[str | None, ...]:
        """``layer_scalar`` after the MLP's contribution, the last."""
        return (None, "layer_scalar")


MODEL_TYPES = ("gemma4_unified_text",)
ENVOYS = {
    MODELING.Gemma4UnifiedTextDecoderLayer: Gemma4UnifiedLayer,
    MODELING.Gemma4UnifiedTextAttention: PostNormAttention,
    MODELING.Gemma4UnifiedTextMLP: PostNormMlp,
}
RENAME: dict = {}
#: Gemma-4's tiny text model without the per-layer input and the mixture of experts, which this one has not.
TINY_CONFIG = {
    name: value
    for name, value in gemma4_text.TINY_CONFIG.items()
    if name
    not in ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block")
    + ("num_experts", "top_k_experts", "moe_intermediate_size")
}
