"""LLaVA 1.5: a CLIP tower, a two-layer projector, any text model.

The wrapper takes ``vision.layers[-2].layer_output`` and drops the CLS token
before the projector (``vision_feature_layer``, ``vision_feature_select_strategy``),
so ``projector.input`` is not ``tower_output``.
"""

from transformers.models.clip import modeling_clip as CLIP
from transformers.models.llava import modeling_llava as MODELING

from nnterp import ImageScatter, Vision, VisionLayer, VisionMlp
from nnterp_attention.vision import VisionAttention

MODEL_TYPES = ("llava",)
#: CLIP's vision tower, which the LLaVA line shares.
CLIP_ENVOYS = {
    CLIP.CLIPVisionModel: Vision,
    CLIP.CLIPEncoderLayer: VisionLayer,
    CLIP.CLIPAttention: VisionAttention,
    CLIP.CLIPMLP: VisionMlp,
}
ENVOYS = {**CLIP_ENVOYS, MODELING.LlavaModel: ImageScatter}
#: The tower's block spells its norms and MLP its own way, as CLIP does everywhere.
CLIP_RENAME = {
    "encoder.layers": "layers",
    "layer_norm1": "input_layernorm",
    "layer_norm2": "post_attention_layernorm",
    "fc2": "down_proj",
    "activation_fn": "act_fn",
}
RENAME = {"model.vision_tower": "vision", "model.multi_modal_projector": "projector", **CLIP_RENAME}
IMAGE_TOKENS = ("<image>",)
IMAGE_PROMPT = "<image>"
TINY_CONFIG = dict(
    text_config=dict(
        model_type="llama",
        vocab_size=80,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    ),
    vision_config=dict(
        model_type="clip_vision_model",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        projection_dim=16,
    ),
    vision_feature_layer=-2,
    vision_feature_select_strategy="default",
)


def tiny_processor(tokenizer):
    """The wrapper's processor over ``tokenizer``, from its defaults at the tiny tower's image size."""
    from transformers import LlavaProcessor
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    images = LlavaImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        image_token="<image>",
        num_additional_image_tokens=1,
    )
