"""Qwen2-VL: the Qwen ViT with its merger inside, a Qwen2 text model under multimodal rotary positions.

The tower (``model.visual``) runs on every image's patches packed into one row,
attends within each image, and ends in the merger (the projector), which folds
each 2 x 2 square of patches into one image token in the text width; the
tower's ``pooler_output`` is the merger's output, split per image by the
wrapper and concatenated again at the scatter. The processor writes one image
token per merged square between a vision-start and a vision-end token, and
returns ``image_grid_thw`` (each image's grid of patches) and
``mm_token_type_ids`` (1 at image tokens), from which the wrapper builds the
text model's three-axis rotary positions. The text model has no family of its
own: its modules are keyed here, and a text-only load of the text config
(``qwen2_vl_text``) is this family too.
"""

from transformers.models.qwen2_vl import modeling_qwen2_vl as MODELING

from nnterp import ImageScatter, Layer, Mlp, QwenVision, VisionLayer, VisionMlp
from nnterp_attention.attention import Attention
from nnterp_attention.qwen_vision import QwenVisionAttention, images_only

#: transformers rebuilds a saved Qwen-VL processor only with its video processor, which needs torchvision.
PROCESSOR_NEEDS_TORCHVISION = True
MODEL_TYPES = ("qwen2_vl", "qwen2_vl_text")
ENVOYS = {
    MODELING.Qwen2VisionTransformerPretrainedModel: QwenVision,
    MODELING.Qwen2VLVisionBlock: VisionLayer,
    MODELING.VisionAttention: QwenVisionAttention,
    MODELING.VisionMlp: VisionMlp,
    MODELING.Qwen2VLModel: ImageScatter,
    MODELING.Qwen2VLDecoderLayer: Layer,
    MODELING.Qwen2VLAttention: Attention,
    MODELING.Qwen2MLP: Mlp,
}
#: The Qwen ViT's block spells its sublayers and norms its own way; no text module has these names.
QWEN_VISION_RENAME = {
    "model.visual": "vision",
    "model.visual.merger": "projector",
    "blocks": "layers",
    "attn": "self_attn",
    "norm1": "input_layernorm",
    "norm2": "post_attention_layernorm",
}
RENAME = {**QWEN_VISION_RENAME, "fc2": "down_proj", "act": "act_fn"}
IMAGE_TOKENS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")
IMAGE_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>"
#: The text model's ids, which its config otherwise sets to the real vocabulary's.
TEXT_IDS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)
#: The tiny text model of the Qwen-VL line: M-RoPE's three sections share a 16-wide head's 8 frequencies.
TINY_TEXT = dict(
    vocab_size=80,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
    **TEXT_IDS,
)
TINY_CONFIG = dict(
    text_config=TINY_TEXT,
    vision_config=dict(
        depth=2,
        embed_dim=32,
        hidden_size=64,  # the merger's output: the text width
        num_heads=4,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    ),
)


def tiny_processor(tokenizer):
    """The wrapper's processor over ``tokenizer`` and a pillow image processor, without a video processor."""
    from transformers import Qwen2VLProcessor

    return images_only(Qwen2VLProcessor, tokenizer, patch_size=14)
