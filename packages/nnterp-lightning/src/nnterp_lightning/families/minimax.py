"""MiniMax: blocks of lightning attention or softmax attention, each followed by a sparse mixture of experts.

Every block keeps its mixer at ``self_attn``: a ``MiniMaxLightningAttention``,
served as ``linear_attn`` (:class:`~nnterp_lightning.LightningAttention`), or,
on ``full_attention`` blocks, softmax attention, served as ``self_attn``
(:class:`~nnterp_lightning.block.MiniMaxLayer`). The experts' router is a softmax
over every expert with the top-k weights renormalized, as Mixtral's.

The block weights its residual, and its residual is the *normed* stream::

    h = input_layernorm(x)
    m = alpha_attn * h + beta_attn * mixer(h)             # layer_mid
    n = post_attention_layernorm(m)
    y = alpha_mlp * n + beta_mlp * mlp(n)                 # layer_output

so ``layer_input + attention_output + mlp_output == layer_output`` does not
hold, whatever the factors (``linear_attn_*``, ``full_attn_*``, ``mlp_*``
``_alpha_factor`` / ``_beta_factor`` in the config). What holds is
``layer_mid == alpha_attn * attention_norm_output + beta_attn * attention_output``
and ``layer_output == alpha_mlp * mlp_norm_output + beta_mlp * mlp_output``
(:func:`~nnterp_lightning.block.residual_factors`).
"""

from transformers.models.minimax import modeling_minimax as MODELING

from nnterp import Moe, Scoring
from nnterp_attention.attention import Attention
from nnterp_lightning.block import MiniMaxLayer
from nnterp_lightning.lightning_attention import LightningAttention


class MiniMaxMoe(Moe):
    """Softmax routing, the top-k probabilities renormalized."""

    SCORING = Scoring(normalize=True)


MODEL_TYPES = ("minimax",)
ENVOYS = {
    MODELING.MiniMaxDecoderLayer: MiniMaxLayer,
    MODELING.MiniMaxAttention: Attention,
    MODELING.MiniMaxLightningAttention: LightningAttention,
    MODELING.MiniMaxSparseMoeBlock: MiniMaxMoe,
}
RENAME = {MODELING.MiniMaxLightningAttention: "linear_attn", MODELING.MiniMaxTopKRouter: "router"}
# blocks 0 and 2 lightning, 1 softmax; blocks of 4 tokens, so a prompt of a few tokens crosses a block boundary
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=2,
    block_size=4,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_attn_alpha_factor=1.5,
    linear_attn_beta_factor=0.5,
    full_attn_alpha_factor=0.8,
    full_attn_beta_factor=1.25,
    mlp_alpha_factor=1.2,
    mlp_beta_factor=0.75,
)
