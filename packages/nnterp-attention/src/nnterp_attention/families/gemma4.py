"""Gemma-4: a ViT over a padded row of patches, a pooling inside the tower, one projection, Gemma-4's text model.

The processor resizes each image, keeping its aspect ratio, to the most
patches its budget allows (``max_soft_tokens`` times the square of
``pooling_kernel_size``) and hands the tower each image as one row of
flattened patches, padded to that budget, with each patch's (x, y) position
(-1 on padding). The tower (``model.vision_tower``) embeds the patches
linearly (``patch_embeddings``, before the position embedding), runs its
blocks over the row with the padding masked out, and returns its encoder's
last hidden state (``tower_output``: one row per image, padding included);
then, still inside the tower, it average-pools each square of
``pooling_kernel_size`` patches, drops the padding and scales, so
``projector.input`` is [pooled tokens of every image, vision_hidden_size].
The projector (``model.embed_vision``) normalizes and projects each token,
and each lands on one image token, which the processor wraps in begin- and
end-of-image tokens.

The tower's blocks are Gemma's sandwich: each sublayer is normalized before
and after, and its post-norm's output is what the block adds. Its attention
scales its scores by one: its queries and keys are RMS-normalized per head.

The text model is Gemma-4's (the ``gemma4_text`` family). An audio tower, where
the checkpoint has one, is not served.
"""

from transformers.models.gemma4 import modeling_gemma4 as MODELING

from nnterp import ImageScatter, Unavailable, Vision, VisionLayer, VisionMlp
from nnterp.components.vision import on_patches
from nnterp.order import standard_path
from nnterp_attention.post_norm import SandwichLayer
from nnterp_attention.vision import VisionAttention

from . import gemma4_text

#: Why the tower has no one image size.
ANY_SIZE = (
    "the tower takes any resolution: the processor resizes each image, keeping its aspect ratio, to at most "
    "max_soft_tokens * pooling_kernel_size**2 patches, and pads its row of patches to that many"
)


class Gemma4Vision(Vision):
    """Gemma-4's tower: a linear patch embedding, its blocks, then the pooling and standardization inside it."""

    PATCH_EMBEDDINGS = "patch_embedder.input_proj.output"
    # The tower returns its pooled tokens: the blocks' stream is read where the encoder returns it.
    TOWER_OUTPUT = "encoder.output"

    @property
    def image_size(self) -> int:
        """Unavailable: each image keeps its aspect ratio, within a budget of patches."""
        raise Unavailable(f"image_size on {standard_path(self)}: {ANY_SIZE}")


@on_patches
class Gemma4VisionLayer(SandwichLayer, VisionLayer):
    """A tower block: Gemma's sandwich of norms around each sublayer, over patches."""


class Gemma4VisionAttention(VisionAttention):
    """A tower block's attention: its contribution is its post-norm's output; its size is the tower config's."""

    CONTRIBUTION = "../post_attention_layernorm.output"

    @property
    def num_heads(self) -> int:
        """Query heads, as the tower's config says (its projections wrap their linear layers)."""
        return self._module.config.num_attention_heads


class Gemma4VisionMlp(VisionMlp):
    """A tower block's gated MLP: its contribution is its post-norm's output."""

    CONTRIBUTION = "../post_feedforward_layernorm.output"


MODEL_TYPES = ("gemma4",)
#: The text model's blocks add their per-layer input after the feed-forward.
CONTRIBUTIONS = gemma4_text.CONTRIBUTIONS
ENVOYS = {
    MODELING.Gemma4VisionModel: Gemma4Vision,
    MODELING.Gemma4VisionEncoderLayer: Gemma4VisionLayer,
    MODELING.Gemma4VisionAttention: Gemma4VisionAttention,
    MODELING.Gemma4VisionMLP: Gemma4VisionMlp,
    MODELING.Gemma4Model: ImageScatter,
}
RENAME = {"model.vision_tower": "vision", "model.embed_vision": "projector", "encoder.layers": "layers"}
#: The image token (the one the features land on) first; the processor asks its tokenizer for all six.
IMAGE_TOKENS = ("<|image|>", "<|image>", "<image|>", "<|audio|>", "<|audio>", "<audio|>")
IMAGE_PROMPT = "<|image|>"
#: transformers rebuilds Gemma-4's saved processor only with its video processor, which needs torchvision.
PROCESSOR_NEEDS_TORCHVISION = True
TINY_CONFIG = dict(
    # The image tokens make a prompt longer than the text family's sliding window, and take ids the per-layer
    # embedding must cover, as a checkpoint's covers its whole vocabulary.
    text_config={
        **gemma4_text.TINY_CONFIG,
        "model_type": "gemma4_text",
        "vocab_size": 84,
        "vocab_size_per_layer_input": 84,
        "sliding_window": 512,
    },
    vision_config=dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        patch_size=4,
        pooling_kernel_size=2,
        position_embedding_size=160,
    ),
    audio_config=None,
    image_token_id=75,
    boi_token_id=76,
    eoi_token_id=77,
    audio_token_id=78,
    boa_token_id=79,
    eoa_token_index=80,
    video_token_id=81,
)


def tiny_processor(tokenizer):
    """The wrapper's processor over ``tokenizer``, images only, at the tiny tower's patch and pooling sizes.

    transformers' processor also takes an audio feature extractor and a video
    processor (whose classes need torchvision); this one is built without.
    The image processor's smallest budget is 70 tokens an image.
    """
    from transformers import Gemma4Processor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    image, begin, end, audio, audio_begin, audio_end = IMAGE_TOKENS
    # The processor reads its tokens off the tokenizer by name, as a Gemma-4 tokenizer names them.
    tokenizer._set_model_specific_special_tokens(
        {
            "image_token": image,
            "boi_token": begin,
            "eoi_token": end,
            "audio_token": audio,
            "boa_token": audio_begin,
            "eoa_token": audio_end,
        }
    )
    vision = TINY_CONFIG["vision_config"]
    images = Gemma4ImageProcessorPil(
        patch_size=vision["patch_size"], pooling_kernel_size=vision["pooling_kernel_size"], max_soft_tokens=70
    )
    return images_only(Gemma4Processor)(image_processor=images, tokenizer=tokenizer)


def images_only(processor: type) -> type:
    """A subclass of Gemma-4's ``processor`` class whose parts are its image processor and tokenizer alone.

    A processor's parts are the parameters its ``__init__`` names; Gemma-4's
    hands its parent the feature extractor and the video processor by
    keyword, which a processor without them refuses, so the ``None`` it
    passes for each is dropped on the way.
    """
    from transformers.processing_utils import ProcessorMixin

    class Parts(ProcessorMixin):
        def __init__(self, *args, **kwargs):
            kwargs = {name: value for name, value in kwargs.items() if value is not None or name == "chat_template"}
            super().__init__(*args, **kwargs)

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        processor.__init__(self, None, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return type(f"{processor.__name__}ImagesOnly", (processor, Parts), {"__init__": __init__, "__module__": __name__})
