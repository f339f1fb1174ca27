"""Beam: a sandwich block whose two additions weigh the stream and the contribution by the addition's depth.

The block normalizes each sublayer's output (``post_attention_layernorm``,
``post_feedforward_layernorm``) and adds it with
``depth_scaled_residual_add``: addition number ``k`` of the model, counted
from 2 (block ``i`` makes additions ``2i + 2`` and ``2i + 3``), gives
``contribution / sqrt(k) + stream * sqrt((k - 1) / k)``. So::

    layer_mid    = D(attention_output, layer_input, 2i + 2)
    layer_output = D(mlp_output, layer_mid, 2i + 3)

and the plain sum never holds (``stream_after_adding`` is ``D``). The
stream's norm stays about constant with depth instead of growing.

Sliding-window blocks rotate their queries and keys; full-attention blocks
use no positions and scale their queries by ``(1 + (position + 1) / 2048) **
0.1`` instead, so their ``attention_queries`` are the scaled ones the scores
are computed with. Each head's output is gated by a sigmoid of the block's
input before ``o_proj``; ``attention_head_outputs`` are before that gate.

The first blocks hold a dense MLP and the rest a mixture (``mlp_layer_types``).
The router scores every expert with a sigmoid and picks the top-k of the
scores plus ``e_score_correction_bias`` within the best ``topk_group`` of
``n_group`` groups, renormalized where ``norm_topk_prob`` says; unlike
DeepSeek-V3's, it does not scale the weights: the mixture multiplies the
experts' sum by ``routed_scaling_factor`` before the post-norm.
"""

from typing import Any

import torch
from transformers.models.beam import modeling_beam as MODELING

from nnterp import Moe, Scoring
from nnterp_attention.post_norm import PostNormAttention, PostNormMlp, SandwichLayer


class BeamLayer(SandwichLayer):
    """Beam's block: each addition weighs the stream and the post-normed contribution by the addition's depth."""

    def stream_after_adding(self, index: int, stream: Any, contribution: Any) -> Any:
        """``depth_scaled_residual_add(contribution, stream, k)``, ``k`` the block's count for that addition."""
        block = self._module
        depth = (block.attn_residual_add_idx, block.mlp_residual_add_idx)[index]
        with torch.no_grad():
            return MODELING.depth_scaled_residual_add(contribution, stream, depth)


class BeamMoe(Moe):
    """Grouped sigmoid routing with a selection bias, renormalized; the experts' sum scaled, then post-normed."""

    SCORING = Scoring(function="sigmoid", normalize="norm_topk_prob", bias="e_score_correction_bias")
    CONTRIBUTION = PostNormMlp.CONTRIBUTION

    def mixture_output(self, routed: Any, shared: Any) -> Any:
        """``post_feedforward_layernorm(routed_output * routed_scaling_factor)``: what the block adds."""
        module = self._module
        return self.parent._module.post_feedforward_layernorm(routed * module.routed_scaling_factor)


MODEL_TYPES = ("beam",)
ENVOYS = {
    MODELING.BeamDecoderLayer: BeamLayer,
    MODELING.BeamAttention: PostNormAttention,
    MODELING.BeamMLP: PostNormMlp,
    MODELING.BeamMoE: BeamMoe,
}
RENAME = {MODELING.BeamTopKRouter: "router"}
# A sliding block with rotary positions, then a full one without, scaling its queries; block 0 dense, block 1 a
# mixture whose eight experts fall in four groups, two of them kept per token.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    sliding_window=64,  # longer than the test prompts, so every pattern is the full causal one
    layer_types=["sliding_attention", "full_attention"],
    mlp_layer_types=["dense", "sparse"],
    num_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
)
