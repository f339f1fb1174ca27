"""MiMo-V2-Flash: pre-norm blocks of full or sliding-window attention, the first dense and the rest a mixture of experts.

The attention's queries and keys are ``head_dim`` wide and its values
``v_head_dim``; on sliding-window blocks it appends a learned sink logit per
head to the scores before the softmax and drops it after (``SinkAttention``). The router
(``gate`` -> ``router``) is DeepSeek-V3's: a sigmoid over every expert, the
top-k of the scores plus ``e_score_correction_bias`` within the best
``topk_group`` of ``n_group`` groups, weighed by the plain scores,
renormalized where ``norm_topk_prob`` says, times ``routed_scaling_factor``.
There is no shared expert. ``mlp_layer_types`` says which blocks are dense.
"""

from __future__ import annotations

from typing import Any

from transformers.models.mimo_v2_flash import modeling_mimo_v2_flash as MODELING

from nnterp import EProperty, Layer, Mlp, Moe, Scoring
from nnterp.layouts import Pattern
from nnterp_attention.attention import interface_reason
from nnterp_attention.sink import SCORES, SinkAttention

#: Inside the eager function, on a block without sinks: the softmax, whose input is the scores less their row maximum.
SOFTMAX = "F_softmax_0"


def _has_sinks(attention: MiMoV2FlashAttention) -> bool:
    return attention._module.sinks is not None


class MiMoV2FlashAttention(SinkAttention):
    """GPT-OSS's attention with sinks on sliding-window blocks, and a plain softmax attention on the others.

    The eager function appends each head's sink to the scores only where the
    block has sinks, and subtracts each row's maximum before the softmax. So
    ``attention_scores`` is read where the sinks are concatenated on a block
    with sinks, and at the softmax's input on a block without, where it is
    the scores less their row maximum: the same pattern, as a softmax does
    not change when a row is shifted. ``sink_logits`` is ``-inf`` on a block
    without sinks. Queries and keys are ``head_dim`` wide, values
    ``v_head_dim``.
    """

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's queries and keys: the module's ``head_dim`` (its values are ``v_head_dim`` wide)."""
        return self._module.head_dim

    @EProperty(
        lambda attention: (
            f"source.{attention.INTERFACE}.source.{attention.CONCAT if _has_sinks(attention) else SOFTMAX}.inputs"
        ),
        select=lambda attention: SCORES if _has_sinks(attention) else 0,
        unavailable=interface_reason,
    )
    def attention_scores(self, value: Any) -> Pattern:
        """The scaled, masked scores, [batch, num_heads, query, key]: before the sink column where the block has sinks, else less each row's maximum.

        ``softmax(cat([attention_scores, sink_logits]))[..., :-1]`` is
        ``attention_probabilities`` on every block. Assign or edit in place.
        """
        return value


class MiMoV2FlashMoe(Moe):
    """Sigmoid routing with a selection bias within groups, renormalized and scaled."""

    SCORING = Scoring(
        function="sigmoid", normalize="norm_topk_prob", bias="e_score_correction_bias", scale="routed_scaling_factor"
    )


MODEL_TYPES = ("mimo_v2_flash",)
ENVOYS = {
    MODELING.MiMoV2FlashDecoderLayer: Layer,
    MODELING.MiMoV2FlashAttention: MiMoV2FlashAttention,
    MODELING.MiMoV2FlashMoE: MiMoV2FlashMoe,
    MODELING.MiMoV2FlashMLP: Mlp,
}
RENAME = {MODELING.MiMoV2FlashTopkRouter: "router"}
# Block 0 is dense; blocks 1 (sliding, with sinks) and 2 (full) mixtures whose eight experts fall in two groups.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    v_head_dim=16,
    layer_types=["full_attention", "sliding_attention", "full_attention"],
    mlp_layer_types=["dense", "sparse", "sparse"],
    sliding_window=64,  # longer than the test prompts, so every pattern is the full causal one
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=2.0,
)
