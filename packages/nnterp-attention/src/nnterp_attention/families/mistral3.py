"""Mistral 3: a Pixtral tower, a patch merger and a two-layer projector, a Mistral text model.

The tower packs every image into one row of patches; the projector
(``multi_modal_projector``) takes the row of ``vision_feature_layer``'s stream
(the last block's by default, which is ``tower_output``: Pixtral has no final
norm) as [all patches, vision_hidden_size], norms it, folds each
``spatial_merge_size`` square of an image's patches into one (the patch merger,
inside the projector, splitting the row by ``image_sizes``) and projects it to
the text width. The processor writes one image token per merged square, with
a row-break token after each row and an end token for the last, so only the
image tokens receive features.
"""

from transformers.models.mistral3 import modeling_mistral3 as MODELING
from transformers.models.pixtral import modeling_pixtral as PIXTRAL

from nnterp import ImageScatter, VisionLayer, VisionMlp
from nnterp.components.pixtral import PixtralVision
from nnterp_attention.vision import VisionAttention

from . import mistral

#: transformers resolves the saved PixtralProcessor only with torchvision.
PROCESSOR_NEEDS_TORCHVISION = True
MODEL_TYPES = ("mistral3",)
ENVOYS = {
    PIXTRAL.PixtralVisionModel: PixtralVision,
    PIXTRAL.PixtralAttentionLayer: VisionLayer,
    PIXTRAL.PixtralAttention: VisionAttention,
    PIXTRAL.PixtralMLP: VisionMlp,
    MODELING.Mistral3Model: ImageScatter,
}
#: Pixtral's block spells its sublayers and norms its own way; no Mistral text module has these names.
PIXTRAL_RENAME = {
    "transformer.layers": "layers",
    "attention": "self_attn",
    "attention_norm": "input_layernorm",
    "feed_forward": "mlp",
    "ffn_norm": "post_attention_layernorm",
}
RENAME = {"model.vision_tower": "vision", "model.multi_modal_projector": "projector", **PIXTRAL_RENAME}
IMAGE_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]")
IMAGE_PROMPT = "[IMG]"
#: Patches of 8 pixels merged 2 x 2: the processor resizes each image to a multiple of 16 pixels, at most 64.
TINY_CONFIG = dict(
    text_config={**mistral.TINY_CONFIG, "model_type": "mistral", "vocab_size": 80, "sliding_window": None},
    vision_config=dict(
        model_type="pixtral",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=64,
        patch_size=8,
    ),
    spatial_merge_size=2,
)


def pixtral_processor() -> type:
    """``PixtralProcessor``, imported without torchvision.

    Its module imports one helper, ``get_resize_output_image_size``, from the
    torchvision image processor's module; the pillow one defines the same
    helper, and stands in for that module while the processor's is imported.
    """
    import sys

    from transformers.models.pixtral import image_processing_pil_pixtral

    name = "transformers.models.pixtral.image_processing_pixtral"
    real = sys.modules.get(name)
    sys.modules[name] = real or image_processing_pil_pixtral
    try:
        from transformers.models.pixtral.processing_pixtral import PixtralProcessor
    finally:
        if real is None:
            del sys.modules[name]
    return PixtralProcessor


def tiny_processor(tokenizer):
    """Pixtral's processor over ``tokenizer``: each image resized to a multiple of the merged patch, at most 64 pixels."""
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    vision, merge = TINY_CONFIG["vision_config"], TINY_CONFIG["spatial_merge_size"]
    images = PixtralImageProcessorPil(size={"longest_edge": vision["image_size"]})
    processor = pixtral_processor()
    return processor(
        image_processor=images, tokenizer=tokenizer, patch_size=vision["patch_size"], spatial_merge_size=merge
    )
