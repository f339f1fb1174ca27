"""LLaVA-NeXT: LLaVA's CLIP tower and projector, on images of any resolution cut into tiles.

The processor picks the image's best resolution among ``image_grid_pinpoints``,
resizes and pads it to that, cuts it into tower-sized tiles and puts a resized
copy of the whole image first (the base tile); ``pixel_values`` is
[images, tiles, 3, H, W], padded to the largest image's tile count. The
wrapper drops the padding tiles (it recounts each image's tiles from
``image_sizes``) and runs the tower on every tile at once, so the tower's rows
are tiles, image after image. As in LLaVA, ``vision.layers[-2].layer_output``
without its CLS token reaches the projector. After it, each image's tiles are
stitched back into one grid, the padding rows or columns are cut away
(unpadding), an ``image_newline`` vector ends each row of the grid, and the
base tile's features go first: what is scattered is no longer one row per
patch.
"""

from transformers.models.llava_next import modeling_llava_next as MODELING

from nnterp import ImageScatter

from . import llava

MODEL_TYPES = ("llava_next",)
ENVOYS = {**llava.CLIP_ENVOYS, MODELING.LlavaNextModel: ImageScatter}
RENAME = llava.RENAME
IMAGE_TOKENS = llava.IMAGE_TOKENS
IMAGE_PROMPT = llava.IMAGE_PROMPT
#: The (height, width) an image may be resized to, in tiles of the tower's 28 pixels: a wide image takes one row
#: of two tiles, any other a 2 x 2 grid, which a tall image fills in part (its unpadding cuts columns).
GRID_PINPOINTS = [[28, 56], [56, 56]]
TINY_CONFIG = {**llava.TINY_CONFIG, "image_grid_pinpoints": GRID_PINPOINTS}


def tiny_processor(tokenizer):
    """The wrapper's processor over ``tokenizer``: tiles of the tiny tower's image size, the tiny grid pinpoints."""
    from transformers import LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    images = LlavaNextImageProcessorPil(
        size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, image_grid_pinpoints=GRID_PINPOINTS
    )
    return LlavaNextProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKENS[0],
        num_additional_image_tokens=1,
    )
