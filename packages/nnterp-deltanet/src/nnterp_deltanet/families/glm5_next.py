"""GLM-5-Next (transformers 5.17 on): Kimi delta attention (KDA) and indexed latent attention (DSA) blocks on
residual streams that hyper-connections mix (mHC), each with a dense or a mixture-of-experts feed-forward.

transformers ships it only as its multimodal wrapper, which loads with its
processor for images and without one for text: the wrapper is registered as
the model type's causal LM (``CAUSAL_LM``), and a text load keeps its tower,
whose values are then unavailable. As on Kimi-Linear, both mixers sit at
``self_attn``; the delta attention is standardized to ``linear_attn``. After
the last block the model averages the streams (``hc_head``) before the final
norm. The tower (``model.vision``) is a Qwen-style ViT (``Glm5NextVision``);
``Glm5NextModel`` scatters its features into the text embeddings, which start
every residual stream: each stream of ``layers[0].layer_input`` is
``image_features`` at the image tokens.
"""

from transformers.models.glm5_next import modeling_glm5_next as MODELING

from nnterp import HyperConnectionLayer, ImageScatter, Mlp, Moe, QwenVision, Scoring, TupleLayer, VisionLayer, VisionMlp
from nnterp_attention import Attention
from nnterp_attention.families.qwen2_vl import QWEN_VISION_RENAME
from nnterp_attention.qwen_vision import QwenVisionAttention, without_videos
from nnterp_deltanet.blocks import SelfAttnMixerLayer
from nnterp_deltanet.linear_attention import KimiDeltaAttention


class Glm5NextLayer(HyperConnectionLayer, SelfAttnMixerLayer, TupleLayer):
    """GLM-5-Next's block: it returns the indexer's choices beside the streams, for a block that shares them."""

    STREAMS = "attn_hc.hc_mult"


class Glm5NextMoe(Moe):
    """DeepSeek-V3's routing: sigmoid scores, a selection bias within groups, renormalized and scaled; ungated shared experts.

    The experts clamp their gate and up projections at ``swiglu_limit``.
    """

    SCORING = Scoring(
        function="sigmoid", normalize="norm_topk_prob", bias="e_score_correction_bias", scale="routed_scaling_factor"
    )
    SHARED = "shared_experts.output"


class Glm5NextVision(QwenVision):
    """GLM-5-Next's tower: the Qwen ViT's packed row, then a final norm and a downsampling before the merger.

    The blocks see the patch embedding's output as it is (the positions are a
    2D rotary embedding inside the attention), so ``patch_embeddings`` is
    ``layers[0].layer_input``. After the blocks the tower applies
    ``post_layernorm`` (an RMS norm), whose output is ``tower_output``:
    [1, patches, vision_hidden_size], in the processor's merge-block order.
    Then ``downsample``, a convolution with kernel and stride
    ``spatial_merge_size``, folds each merge block into one vector of
    ``out_hidden_size`` (what the tower returns as ``last_hidden_state``, and
    ``projector.input``), and the merger (``projector``) maps each vector on
    its own into what the text model receives (``projector.output``, which
    the wrapper splits per image and scatters as ``image_features``).
    """

    TOWER_OUTPUT = "post_layernorm.output"
    TOWER_OUTPUT_FIELD = None


class Glm5NextVisionAttention(QwenVisionAttention):
    """The tower's attention: an RMS norm per head (``q_norm``, ``k_norm``) on queries and keys before the rotary embedding.

    ``attention_queries`` and ``attention_keys`` are served after both, as on every Qwen ViT.
    """

    QUERIES = "source.query_states_1.output"
    KEYS = "source.key_states_1.output"


CAUSAL_LM = MODELING.Glm5NextForConditionalGeneration
#: ``glm5_next_text`` is the wrapper's text_config: naming it keeps a load on this family's text envoys.
MODEL_TYPES = ("glm5_next", "glm5_next_text")
ENVOYS = {
    MODELING.Glm5NextTextDecoderLayer: Glm5NextLayer,
    MODELING.Glm5NextTextLinearAttention: KimiDeltaAttention,
    MODELING.Glm5NextTextAttention: Attention,
    MODELING.Glm5NextTextMoE: Glm5NextMoe,
    MODELING.Glm5NextTextMLP: Mlp,
    MODELING.Glm5NextVisionModel: Glm5NextVision,
    MODELING.Glm5NextVisionBlock: VisionLayer,
    MODELING.Glm5NextVisionAttention: Glm5NextVisionAttention,
    MODELING.Glm5NextVisionMLP: VisionMlp,
    MODELING.Glm5NextModel: ImageScatter,
}
RENAME = {
    **QWEN_VISION_RENAME,
    MODELING.Glm5NextTextLinearAttention: "linear_attn",
    MODELING.Glm5NextTextTopkRouter: "router",
}
IMAGE_TOKENS = ("<|image|>", "<|begin_of_image|>", "<|end_of_image|>")
IMAGE_PROMPT = "<|begin_of_image|><|image|><|end_of_image|>"
#: transformers rebuilds a saved GLM-5-Next processor only with its video processor, which needs torchvision.
PROCESSOR_NEEDS_TORCHVISION = True
TINY_CONFIG = dict(
    text_config=dict(
        vocab_size=80,  # the local tokenizer's 75 symbols, then the image tokens
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        # the indexed attention takes no rotary part (NoPE)
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=0,
        qk_nope_head_dim=16,
        v_head_dim=8,
        index_topk=64,  # more than the test prompts, so the indexer keeps every token: the full causal pattern
        index_head_dim=16,
        index_n_heads=2,
        index_kpool=2,
        # 5.17 spells the indexed blocks deepseek_sparse_attention, later releases indexed_attention; all read the first
        layer_types=["linear_attention", "deepseek_sparse_attention", "linear_attention", "deepseek_sparse_attention"],
        indexer_types=["full"] * 4,
        mlp_layer_types=["dense", "sparse", "sparse", "dense"],
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=4,  # groups of two: the router keeps its best two groups, then their top two experts
        topk_group=2,
        linear_num_heads=2,
        linear_head_dim=8,
        hc_mult=3,  # with two, a doubly stochastic mixing is symmetric: a transposed one would go unnoticed
        hc_sinkhorn_iters=4,
        pad_token_id=0,
    ),
    vision_config=dict(
        depth=2,
        hidden_size=16,
        intermediate_size=32,
        out_hidden_size=32,  # the text width
        num_heads=2,
        projection_intermediate_size=32,
    ),
)


def tiny_processor(tokenizer):
    """The wrapper's processor over ``tokenizer`` and its pillow image processor, without a video processor.

    Images are resized to between 4 and 16 image tokens (merged squares of 28 pixels a side).
    """
    from transformers.models.glm5_next.image_processing_pil_glm5_next import Glm5NextImageProcessorPil
    from transformers.models.glm5_next.processing_glm5_next import Glm5NextProcessor

    images = Glm5NextImageProcessorPil(min_image_tokens=4, max_image_tokens=16)
    return without_videos(Glm5NextProcessor)(image_processor=images, tokenizer=tokenizer)
