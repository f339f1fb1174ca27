"""Gemma-3: a SigLIP tower, a pooling projector, Gemma-3's text model.

The tower (``model.vision_tower``) runs on each image at one fixed
resolution and returns its last hidden state after ``post_layernorm``; that
is all that reaches the projector, so ``projector.input`` is
``tower_output``. The projector average-pools the square grid of patches
down to ``mm_tokens_per_image`` tokens, normalizes and projects them, and
each image is scattered into exactly that many image tokens, which the
processor wraps in begin- and end-of-image tokens. The image tokens of one
image attend to each other both ways (``token_type_ids``).
"""

import torch
from transformers.models.gemma3 import modeling_gemma3 as MODELING
from transformers.models.siglip import modeling_siglip as SIGLIP

from nnterp import ImageScatter, Vision, VisionLayer, VisionMlp
from nnterp_attention.vision import VisionAttention

from . import gemma3_text
from .llava import CLIP_RENAME

MODEL_TYPES = ("gemma3",)
ENVOYS = {
    SIGLIP.SiglipVisionModel: Vision,
    SIGLIP.SiglipEncoderLayer: VisionLayer,
    SIGLIP.SiglipAttention: VisionAttention,
    SIGLIP.SiglipMLP: VisionMlp,
    MODELING.Gemma3Model: ImageScatter,
}
#: SigLIP spells its block's norms and MLP as CLIP does.
RENAME = {"model.vision_tower": "vision", "model.multi_modal_projector": "projector", **CLIP_RENAME}
IMAGE_TOKENS = ("<image_soft_token>", "<start_of_image>", "<end_of_image>")
IMAGE_PROMPT = "<start_of_image>"
TINY_CONFIG = dict(
    text_config={**gemma3_text.TINY_CONFIG, "model_type": "gemma3_text", "vocab_size": 80},
    vision_config=dict(
        model_type="siglip_vision_model",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=56,
        patch_size=14,
        vision_use_head=False,
    ),
    mm_tokens_per_image=4,  # the 4 x 4 patches pooled 2 x 2
    image_token_index=75,
    boi_token_index=76,
    eoi_token_index=77,
)


def tiny_weights(model):
    """Give the tiny wrapper's projection random values: Gemma-3 initializes it to zero, which zeroes every image feature."""
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(generator=torch.Generator().manual_seed(1))


def tiny_processor(tokenizer):
    """The wrapper's processor over ``tokenizer``, at the tiny tower's image size and token count."""
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    image, begin, end = IMAGE_TOKENS
    # The processor reads its tokens off the tokenizer by name, as a Gemma-3 tokenizer names them.
    tokenizer._set_model_specific_special_tokens({"image_token": image, "boi_token": begin, "eoi_token": end})
    images = Gemma3ImageProcessorPil(size={"height": 56, "width": 56})
    return Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=4)
