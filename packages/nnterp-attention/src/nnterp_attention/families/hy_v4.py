"""HY-V4: latent softmax attention with learned sinks and a top-k indexer (DSA), on residual streams that
hyper-connections read and weight without mixing them, each block with a dense or a mixture-of-experts MLP.

The attention's softmax also runs over a sink logit per head
(``SinkAttention``); a sigmoid gate per head, computed from the block's
input, then scales the head outputs before ``o_proj``, so
``attention_head_outputs`` are the heads before that gate. Past the
sublayers each stream carries on as it is (``HYPER_CONNECTION`` has no
mixing), and after the last block a learned weighted sum of the streams
(``hc_head``) enters the final norm.
"""

from typing import Any

from transformers.models.hy_v4 import modeling_hy_v4 as MODELING

from nnterp import HyperConnectionLayer, Mlp, Moe, Scoring, TupleLayer
from nnterp_attention.sink import SinkAttention


class HYV4Layer(HyperConnectionLayer, TupleLayer):
    """HY-V4's block: it returns its indexer's top-k choices beside the streams, for the next block if it shares them."""

    STREAMS = "attn_hc.hc_mult"
    HYPER_CONNECTION = ("weights", "read")

    def skip(self, hidden: Any) -> None:
        """``TupleLayer.skip``, refused where the next block takes this one's indexer choices (its indexer is shared).

        Raises:
            ValueError: the next block's ``config.indexer_types`` entry is
                ``"shared"``: a skipped block hands it no choices to attend by.
        """
        layer, config = self._module.layer_idx, self._module.self_attn.config
        if layer + 1 < config.num_hidden_layers and config.indexer_types[layer + 1] == "shared":
            raise ValueError(
                f"cannot skip layers[{layer}]: layers[{layer + 1}]'s indexer is shared (config.indexer_types), so it "
                f"attends to the keys layers[{layer}] picks, and a skipped block picks none; skip a block whose next "
                "block has an indexer of its own"
            )
        super().skip(hidden)


class HYV4Moe(Moe):
    """DeepSeek-V3's routing: sigmoid scores, a selection bias within groups, renormalized and scaled; ungated shared experts.

    The experts clamp their gate and up projections at ``swiglu_limit``.
    """

    SCORING = Scoring(
        function="sigmoid", normalize="norm_topk_prob", bias="e_score_correction_bias", scale="routed_scaling_factor"
    )
    SHARED = "shared_experts.output"


MODEL_TYPES = ("hy_v4",)
ENVOYS = {
    MODELING.HYV4DecoderLayer: HYV4Layer,
    MODELING.HYV4Attention: SinkAttention,
    MODELING.HYV4MoE: HYV4Moe,
    MODELING.HYV4MLP: Mlp,
}
RENAME = {MODELING.HYV4TopkRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=2,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=8,
    mlp_layer_types=["dense", "sparse", "sparse"],
    # the third block attends to the keys the second picks; the first can be skipped, the second cannot
    indexer_types=["full", "full", "shared"],
    index_topk=64,  # more than the test prompts, so the indexer keeps every token: the full causal pattern
    index_head_dim=16,
    index_n_heads=2,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,  # groups of two: the router keeps its best two groups, then their top two experts
    topk_group=2,
    hc_mult=3,  # streams enough that a weight landing on the wrong one shows
)
