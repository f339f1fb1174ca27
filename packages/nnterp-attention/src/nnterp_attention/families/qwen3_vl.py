"""Qwen3-VL: the Qwen ViT with learned position embeddings and DeepStack, a Qwen3 text model.

The tower (``model.visual``) adds a learned position embedding, interpolated
to each image's grid, to the patch embeddings (so ``patch_embeddings`` is not
``layers[0].layer_input``), attends within each image in every block, and ends
in the merger (the projector). DeepStack: after each block in
``deepstack_visual_indexes`` another merger (``deepstack_merger_list``) folds
that block's stream into image tokens, and the text model adds the k-th of
those to its hidden states at the image tokens right after its block k. So
``layers[0].layer_input[image_token_mask] == image_features`` holds as on
every wrapper, the features being what enters the text model, while for the
first ``len(deepstack_visual_indexes)`` blocks ``layers[k + 1].layer_input``
is ``layers[k].layer_output`` plus the k-th DeepStack features at the image
tokens (the two are equal at text tokens and on a text-only prompt). The text
model's modules are keyed here.
"""

from transformers.models.qwen3_vl import modeling_qwen3_vl as MODELING

from nnterp import ImageScatter, Layer, Mlp, QwenVision, VisionLayer, VisionMlp
from nnterp_attention.attention import Attention
from nnterp_attention.qwen_vision import QwenVisionAttention, images_only

from .qwen2_vl import QWEN_VISION_RENAME, TINY_TEXT

#: transformers rebuilds a saved Qwen-VL processor only with its video processor, which needs torchvision.
PROCESSOR_NEEDS_TORCHVISION = True
MODEL_TYPES = ("qwen3_vl", "qwen3_vl_text")
ENVOYS = {
    MODELING.Qwen3VLVisionModel: QwenVision,
    MODELING.Qwen3VLVisionBlock: VisionLayer,
    MODELING.Qwen3VLVisionAttention: QwenVisionAttention,
    MODELING.Qwen3VLVisionMLP: VisionMlp,
    MODELING.Qwen3VLModel: ImageScatter,
    MODELING.Qwen3VLTextDecoderLayer: Layer,
    MODELING.Qwen3VLTextAttention: Attention,
    MODELING.Qwen3VLTextMLP: Mlp,
}
#: The tower's MLP is ``linear_fc1``, ``act_fn``, ``linear_fc2``.
RENAME = {**QWEN_VISION_RENAME, "linear_fc2": "down_proj"}
IMAGE_TOKENS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")
IMAGE_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>"
TINY_CONFIG = dict(
    text_config={
        **TINY_TEXT,
        "head_dim": 16,
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
    },
    vision_config=dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=64,
        num_heads=4,
        patch_size=16,
        num_position_embeddings=16,  # a 4 x 4 grid of learned positions, interpolated to each image's
        deepstack_visual_indexes=[0],
    ),
)


def tiny_processor(tokenizer):
    """The wrapper's processor over ``tokenizer`` and a pillow image processor, without a video processor."""
    from transformers import Qwen3VLProcessor

    return images_only(Qwen3VLProcessor, tokenizer, patch_size=16)
