"""Qwen2.5-VL: Qwen2-VL with a gated tower MLP, RMS norms, and attention windows in most tower blocks.

The tower (``model.visual``) permutes the packed row into attention windows
right after the patch embedding (``window_size`` pixels a side, each image's
windows in turn), so its blocks' values, ``tower_output`` and the merger's
input and output are in window order; it puts the merger's output back in
the processor's order before returning it, so ``image_features`` is in image
token order. The blocks in ``fullatt_block_indexes`` attend over each whole
image, the others over each window. As on Qwen2-VL, the merger is the
projector, and the text model's modules are keyed here.
"""

from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as MODELING

from nnterp import ImageScatter, Layer, Mlp, QwenVision, VisionLayer, VisionMlp
from nnterp_attention.attention import Attention
from nnterp_attention.qwen_vision import QwenVisionAttention, images_only

from .qwen2_vl import QWEN_VISION_RENAME, TINY_TEXT

#: transformers rebuilds a saved Qwen-VL processor only with its video processor, which needs torchvision.
PROCESSOR_NEEDS_TORCHVISION = True
MODEL_TYPES = ("qwen2_5_vl", "qwen2_5_vl_text")
ENVOYS = {
    MODELING.Qwen2_5_VisionTransformerPretrainedModel: QwenVision,
    MODELING.Qwen2_5_VLVisionBlock: VisionLayer,
    MODELING.Qwen2_5_VLVisionAttention: QwenVisionAttention,
    MODELING.Qwen2_5_VLMLP: VisionMlp,
    MODELING.Qwen2_5_VLModel: ImageScatter,
    MODELING.Qwen2_5_VLDecoderLayer: Layer,
    MODELING.Qwen2_5_VLAttention: Attention,
    MODELING.Qwen2MLP: Mlp,
}
RENAME = QWEN_VISION_RENAME
IMAGE_TOKENS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")
IMAGE_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>"
TINY_CONFIG = dict(
    text_config=TINY_TEXT,
    vision_config=dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=64,
        num_heads=4,
        patch_size=14,
        window_size=56,  # 2 x 2 merged squares: several windows per test image
        fullatt_block_indexes=[0],
    ),
)


def tiny_processor(tokenizer):
    """The wrapper's processor over ``tokenizer`` and a pillow image processor, without a video processor."""
    from transformers import Qwen2_5_VLProcessor

    return images_only(Qwen2_5_VLProcessor, tokenizer, patch_size=14)
