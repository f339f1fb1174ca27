"""DeepSeek-V4: shared key-value attention with learned sinks over a sliding window and compressed entries, on
residual streams that hyper-connections mix (mHC), each block with a mixture of experts.

Each head's softmax also runs over a sink logit (``SinkAttention``). One
projected head (``kv_proj``) is both the key and the value of every query
head: ``attention_keys`` and ``attention_values`` are one tensor, so an
in-place edit of either edits both; assign one to change it alone. A block
(``config.layer_types``) attends over a sliding window, and on compressed
blocks also over entries its compressor (``self_attn.compressor``) makes, one
for every ``config.compress_rates`` tokens, which a query sees once their
window is complete (on a compressed sparse block only the ``index_topk`` its
indexer keeps). The entries follow the tokens on the key axis of the keys,
the values and the pattern, so on a prompt long enough to compress that axis
is longer than the sequence. The head outputs are what the attention
interface returns, before the forward rotates their rotary part back to the
query's position and the grouped output projection (``o_a_proj``,
``o_b_proj``). On the first blocks (``config.mlp_layer_types`` ``"hash_moe"``)
a fixed table of token ids (the router's ``tid2eid``) picks the experts in
place of the scores. After the last block a learned weighted sum of the
streams (``hc_head``) enters the final norm.
"""

from transformers.models.deepseek_v4 import modeling_deepseek_v4 as MODELING

from nnterp import HyperConnectionLayer, Mlp, Moe, Scoring
from nnterp_attention.sink import SinkAttention


class DeepseekV4Layer(HyperConnectionLayer):
    """DeepSeek-V4's block: ``hc_mult`` streams, mixed at each sublayer by its hyper-connection."""

    STREAMS = "attn_hc.hc_mult"


class DeepseekV4Moe(Moe):
    """Square-rooted softplus scores with a selection bias, renormalized and scaled; an ungated shared expert.

    A hash block's router takes each token's experts from its table
    (``tid2eid[input_ids]``), so ``route`` reproduces its weights from the
    logits only at those experts. The experts clamp their gate and up
    projections at ``swiglu_limit``.
    """

    SCORING = Scoring(
        function="sqrtsoftplus", normalize=True, bias="e_score_correction_bias", scale="routed_scaling_factor"
    )
    SHARED = "shared_experts.output"


MODEL_TYPES = ("deepseek_v4",)
ENVOYS = {
    MODELING.DeepseekV4DecoderLayer: DeepseekV4Layer,
    MODELING.DeepseekV4Attention: SinkAttention,
    MODELING.DeepseekV4SparseMoeBlock: DeepseekV4Moe,
    MODELING.DeepseekV4MLP: Mlp,
}
RENAME = {MODELING.DeepseekV4TopKRouter: "router", MODELING.DeepseekV4HashRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    head_dim=16,
    q_lora_rank=16,
    partial_rotary_factor=0.5,
    o_groups=2,
    o_lora_rank=8,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    # Longer than every prompt the suites run, so their keys are the tokens alone (and a left-padded row, whose
    # windows would start in its padding, gives what the prompt alone gives); test_deepseek_v4 compresses.
    compress_rates={"compressed_sparse_attention": 64, "heavily_compressed_attention": 96},
    # the suites' reference routing picks experts from the logits; test_deepseek_v4 routes a hash block by its table
    mlp_layer_types=["moe"] * 3,
    index_n_heads=2,
    index_head_dim=8,
    index_topk=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    hc_mult=3,  # with two, a doubly stochastic mixing is symmetric: a transposed one would go unnoticed
    hc_sinkhorn_iters=4,
)
