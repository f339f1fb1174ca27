"""Qwen4-exp: gated-DeltaNet and indexed softmax-attention blocks, each with a mixture of experts, on several
residual streams (``StreamsLayer``), some blocks adding a per-layer n-gram embedding first.

The multimodal checkpoints (``qwen4_exp``) load as their language model for
text generation, which is this family too.
"""

from transformers.models.qwen4_exp import modeling_qwen4_exp as MODELING

from nnterp import Mlp, Moe, Scoring
from nnterp_attention import Attention
from nnterp_deltanet.blocks import PerLayerEmbedding, StreamsLayer, into_streams
from nnterp_deltanet.linear_attention import LinearAttention

# the block weights each sublayer's output per stream at these operations, in its forward's order
INJECTED = ("../source.injection_0.output", "../source.injection_1.output")


class Qwen4ExpLayer(StreamsLayer):
    """Qwen4-exp's block: its streams read by ``Qwen4ExpTextGatedResidual``s."""

    STREAMS = "attn_hyper_connection.hc_count"


class Qwen4ExpLinearAttention(LinearAttention):
    """The gated DeltaNet; what it adds is its output weighted per stream."""

    CONTRIBUTION = INJECTED[0]
    attention_output = into_streams(LinearAttention.attention_output, "mixer")


class Qwen4ExpAttention(Attention):
    """The gated softmax attention, its keys picked by the QSA indexer; what it adds is its output weighted per stream."""

    CONTRIBUTION = INJECTED[0]
    attention_output = into_streams(Attention.attention_output, "attention")


class Qwen4ExpMoe(Moe):
    """Qwen3-Next's mixture of experts; what it adds is its output weighted per stream.

    Softmax routing, renormalized where the config says; a shared expert
    behind a sigmoid gate. ``routed_output + shared_expert_output`` is the
    module's ``.output``, before the block weights it into the streams.
    """

    SCORING = Scoring(normalize="norm_topk_prob")
    SHARED = "source.shared_expert_output_1.output"
    CONTRIBUTION = INJECTED[1]
    mlp_output = into_streams(Moe.mlp_output, "MLP")


MODEL_TYPES = ("qwen4_exp_text", "qwen4_exp")
#: The per-layer embedding is added before the sequence mixer.
CONTRIBUTIONS = (
    ("ple", "per_layer_output"),
    ("self_attn", "attention_output"),
    ("linear_attn", "attention_output"),
    ("mlp", "mlp_output"),
)
ENVOYS = {
    MODELING.Qwen4ExpTextDecoderLayer: Qwen4ExpLayer,
    MODELING.Qwen4ExpTextGatedDeltaNet: Qwen4ExpLinearAttention,
    MODELING.Qwen4ExpTextAttention: Qwen4ExpAttention,
    MODELING.Qwen4ExpTextSparseMoeBlock: Qwen4ExpMoe,
    MODELING.Qwen4ExpTextMLP: Mlp,
    MODELING.Qwen4ExpTextPLELayer: PerLayerEmbedding,
}
RENAME = {MODELING.Qwen4ExpTextTopKRouter: "router"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    # the third is the indexed (QSA) block, spelled as checkpoints spell it: every release reads it so
    layer_types=["linear_attention", "linear_attention", "full_attention"],
    hc_count=2,
    hc_lowrank=8,
    ple_layer_ids=[2],  # one-indexed: the second block
    ple_embed_dim=16,
    heads_per_ngram=2,
    ngram_vocab_size_base=64,  # hashed n-gram tables of about 64 rows, not 20M
    indexer_n_heads=2,
    indexer_kv_heads=1,
    indexer_head_dim=16,
    indexer_budget=64,  # more than the test prompts, so the indexer keeps every token: the full causal pattern
    indexer_compress_ratio=2,
)
