"""Qwen3.5 (the multimodal wrapper): the Qwen ViT over the Qwen3.5 hybrid text model.

The tower (``model.visual``) is Qwen3-VL's without DeepStack: a learned
position embedding added to the patch embeddings, every image's patches in
one packed row, each image attended on its own, and the merger (the
projector) folding each 2 x 2 square into one image token, scattered into
the text embeddings at the image tokens. The text model is
``qwen3_5_text``'s: its envoys are this family's too, so its gated-DeltaNet
mixers are served on the wrapper and ``route_kernels(model.family, ...)``
routes them. Without a processor the checkpoint loads for text as
``Qwen3_5ForCausalLM``, which is this family with no tower.
"""

from transformers.models.qwen3_5 import modeling_qwen3_5 as MODELING

from nnterp import ImageScatter, QwenVision, VisionLayer, VisionMlp
from nnterp_attention.families import qwen3_vl as QWEN3_VL
from nnterp_attention.qwen_vision import QwenVisionAttention, images_only

from . import qwen3_5_text as TEXT

#: transformers rebuilds a saved Qwen-VL processor only with its video processor, which needs torchvision.
PROCESSOR_NEEDS_TORCHVISION = True
MODEL_TYPES = ("qwen3_5",)
ENVOYS = {
    **TEXT.ENVOYS,
    MODELING.Qwen3_5VisionModel: QwenVision,
    MODELING.Qwen3_5VisionBlock: VisionLayer,
    MODELING.Qwen3_5VisionAttention: QwenVisionAttention,
    MODELING.Qwen3_5VisionMLP: VisionMlp,
    MODELING.Qwen3_5Model: ImageScatter,
}
RENAME = QWEN3_VL.RENAME
IMAGE_TOKENS = QWEN3_VL.IMAGE_TOKENS
IMAGE_PROMPT = QWEN3_VL.IMAGE_PROMPT
TINY_CONFIG = dict(
    text_config=dict(
        TEXT.TINY_CONFIG,
        vocab_size=80,
        head_dim=32,  # a quarter of it rotates: 4 frequencies, interleaved over time, rows and columns
        rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    ),
    vision_config=dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=32,  # the text width
        num_heads=4,
        patch_size=16,
        num_position_embeddings=16,
    ),
)


def tiny_processor(tokenizer):
    """The wrapper's processor over ``tokenizer`` and a pillow image processor, without a video processor."""
    from transformers import Qwen3VLProcessor

    return images_only(Qwen3VLProcessor, tokenizer, patch_size=16)
