"""Llama 4: a ViT over square tiles with a pixel-shuffle adapter inside it, one linear projector, a Llama-4 text model.

The root (``Llama4ForConditionalGeneration``) holds the tower
(``vision_model``), the projector (``multi_modal_projector``) and the text
model (``language_model``), and its own forward scatters the projected
features into the token embeddings (``ROOT_SCATTER``). The processor cuts an
image into tiles of the tower's ``image_size`` (plus a global tile when there
are several), so the tower's rows are tiles, not images. Each tile is a grid of
patches with a CLS token appended at the end; the tower's final norm
(``layernorm_post``) gives ``tower_output``, after which the tower drops the
CLS token and folds each 2 x 2 square of patches into one (``vision_adapter``,
a pixel shuffle and an MLP). ``projector.input`` is that adapter's output,
every tile's flattened into one [tokens, vision_output_dim]; each token lands
on one ``<|patch|>`` token of the prompt.
"""

from transformers.models.llama4 import modeling_llama4 as MODELING

from nnterp import TupleLayer, Vision, VisionLayer, VisionMlp
from nnterp.forward_source import ForwardSource
from nnterp_attention.vision import VisionAttention

from . import llama4_text


class Llama4Vision(Vision):
    """Llama 4's tower: its patch embedding is an unfold and a linear, its stream leaves through ``layernorm_post``."""

    PATCH_EMBEDDINGS = "patch_embedding.output"
    # The tower returns the adapter's output as its last hidden state: the stream is read at the final norm.
    TOWER_OUTPUT = "layernorm_post.output"
    TOWER_OUTPUT_FIELD = None


class Llama4VisionLayer(VisionLayer, TupleLayer):
    """A tower block: it returns its stream in a one-element tuple."""

    RETURNED = 1


#: Where the wrapper's forward hands on ``image_outputs`` read off its text model's output, which has no such field
#: (transformers 5.24): every forward of the wrapper raises, so a checkpoint loads for text.
NO_IMAGES = (
    "this transformers' Llama4ForConditionalGeneration.forward reads image_outputs off its text model's output, "
    "which has none, so every forward of the wrapper raises; the checkpoint loads as Llama4ForCausalLM, for text"
    if ForwardSource.of(MODELING.Llama4ForConditionalGeneration.forward).reads("image_outputs=outputs.image_outputs")
    else None
)
#: transformers resolves Llama 4's saved image processor only with torchvision.
PROCESSOR_NEEDS_TORCHVISION = True
MODEL_TYPES = ("llama4",)
ENVOYS = {
    MODELING.Llama4VisionModel: Llama4Vision,
    MODELING.Llama4VisionEncoderLayer: Llama4VisionLayer,
    MODELING.Llama4VisionAttention: VisionAttention,
    MODELING.Llama4VisionMLP: VisionMlp,
}
#: The operation in the root's forward that scatters the projected features into the embeddings.
ROOT_SCATTER = "inputs_embeds_masked_scatter_0"
#: The text model sits under the root's language_model; the tower's blocks are model.layers under it, as the common
#: names already say, and its MLP's output projection is fc2 (its activation_fn is renamed as the text side's is).
RENAME = {
    "vision_model": "vision",
    "multi_modal_projector": "projector",
    "language_model.model.layers": "layers",
    "language_model.model.embed_tokens": "embed_tokens",
    "language_model.model.norm": "ln_final",
    "language_model.lm_head": "lm_head",
    "fc2": "down_proj",
}
#: The image token (the one the features land on) first: the processor expands each <|image|> into patch tokens.
IMAGE_TOKENS = (
    "<|patch|>",
    "<|image|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
)
IMAGE_PROMPT = "<|image|>"
TINY_CONFIG = dict(
    text_config={**llama4_text.TINY_CONFIG, "model_type": "llama4_text", "vocab_size": 84},
    vision_config=dict(
        hidden_size=16,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=16,
        patch_size=4,
        vision_output_dim=32,
        projector_input_dim=32,
        projector_output_dim=32,
    ),
)


def tiny_processor(tokenizer):
    """Llama 4's processor over ``tokenizer``, with one tile of the tiny tower's image size per image."""
    from transformers import Llama4Processor

    vision = TINY_CONFIG["vision_config"]
    tiles = one_tile_processor(vision["image_size"])
    return Llama4Processor(image_processor=tiles, tokenizer=tokenizer, patch_size=vision["patch_size"])


def one_tile_processor(tile: int):
    """Llama 4's image processor as it runs allowed one tile (``max_patches=1``), on pillow.

    transformers' ``Llama4ImageProcessor`` needs torchvision. Allowed one
    tile, it resizes an image without distortion to fit the tile, pads it
    with black at the bottom and right, rescales and normalizes it, and gives
    it the aspect ratio (1, 1), so the processor writes no separators and no
    global tile: one tile, one row of ``pixel_values``, per image.
    """
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_base import BatchFeature
    from transformers.image_utils import PILImageResampling, SizeDict

    class OneTile(PilBackend):
        resample = PILImageResampling.BILINEAR
        image_mean = [0.5, 0.5, 0.5]
        image_std = [0.5, 0.5, 0.5]
        do_convert_rgb = True
        size = {"max_height": tile, "max_width": tile}
        model_input_names = ["pixel_values", "aspect_ratios"]

        def _preprocess(self, images, size, resample, rescale_factor, image_mean, image_std, return_tensors, **_):
            tiles = []
            for image in images:
                image = self.pad([self.resize(image, size, resample)], pad_size=SizeDict(height=tile, width=tile))[0]
                tiles.append(self.normalize(self.rescale(image, rescale_factor), image_mean, image_std))
            ratios = [[1, 1]] * len(images)
            return BatchFeature({"pixel_values": tiles, "aspect_ratios": ratios}, tensor_type=return_tensors)

    return OneTile()
