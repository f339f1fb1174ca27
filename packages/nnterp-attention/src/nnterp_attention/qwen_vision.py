"""QwenVisionAttention: the Qwen ViT's attention, which splits the packed row per image before attending."""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar

from nnterp import EProperty, unavailable
from nnterp.layouts import HeadOutputs, Keys, Queries, Values

from .vision import VisionAttention

#: Why there is no pattern to read: each image is its own attention call.
PER_IMAGE = (
    "the Qwen ViT attends within each image (or attention window) in a call of its own, so no pattern over the "
    "packed row exists; split attention_queries and attention_keys at the block's cu_seqlens (per image: "
    "image_grid_thw.prod(-1) patches each, in order) and take softmax(q k^T * head_dim**-0.5) per piece"
)
#: Why the head outputs are not there under flash attention.
FLASH = (
    "under flash attention the module makes one variable-length call over the packed row instead of one per "
    "image, and concatenates nothing: load the model with attn_implementation='eager' or 'sdpa'"
)


def _flash(envoy: QwenVisionAttention) -> str | None:
    implementation = getattr(getattr(envoy._module, "config", None), "_attn_implementation", None) or ""
    return FLASH if "flash" in implementation else None


class QwenVisionAttention(VisionAttention):
    """The Qwen ViT's attention: one interface call per image (or window), its interior read whole around them.

    The module projects the packed row, applies the 2D rotary embedding, and
    splits queries, keys and values at ``cu_seqlens`` (the block's argument:
    the processor's ``image_grid_thw`` per image, or Qwen2.5-VL's windows), one
    attention call per piece, and concatenates the outputs. So
    ``attention_queries``, ``attention_keys`` and ``attention_values`` are the
    whole [1, heads, patches, head_dim] tensors before the split (queries and
    keys after the rotary embedding), under every implementation, and
    ``attention_head_outputs`` is the pieces' outputs concatenated back,
    [1, patches, heads, head_dim], under every implementation but flash (one
    variable-length call there). ``attention_scores`` and
    ``attention_probabilities`` are unavailable (``PER_IMAGE``).

    ``QUERIES`` and ``KEYS`` name the operations of the module's forward that
    hold them: the first assignments after the rotary embedding, or later ones
    in a forward that assigns them before it too (GLM-5-Next's per-head norms).
    """

    #: Where the queries are read: their transposed assignment, after the rotary embedding.
    QUERIES: ClassVar[str] = "source.query_states_0.output"
    #: Where the keys are read: their transposed assignment, after the rotary embedding.
    KEYS: ClassVar[str] = "source.key_states_0.output"

    attention_scores = unavailable(PER_IMAGE)
    attention_probabilities = unavailable(PER_IMAGE)

    @EProperty(lambda attention: type(attention).QUERIES)
    def attention_queries(self, value: Any) -> Queries:
        """Every image's queries, [1, heads, patches, head_dim], after the rotary embedding and before the split.

        Assign, or edit in place.
        """
        return value

    @EProperty(lambda attention: type(attention).KEYS)
    def attention_keys(self, value: Any) -> Keys:
        """Every image's keys, [1, heads, patches, head_dim], after the rotary embedding and before the split.

        Assign, or edit in place.
        """
        return value

    @EProperty("source.value_states_0.output")
    def attention_values(self, value: Any) -> Values:
        """Every image's values, [1, heads, patches, head_dim], before the split.

        Assign to replace them: torch refuses in-place edits of this view of
        the fused projection's ``unbind``.
        """
        return value

    @EProperty("source.torch_cat_0.output", unavailable=_flash)
    def attention_head_outputs(self, value: Any) -> HeadOutputs:
        """Every image's per-head outputs concatenated back, [1, patches, heads, head_dim], before the projection.

        Assign, or edit in place.
        """
        return value


@cache
def without_videos(processor: type) -> type:
    """A subclass of a Qwen-VL-style ``processor`` class whose parts are its image processor and tokenizer alone.

    A processor's parts are the parameters its ``__init__`` names, so the
    subclass is built without the video processor (whose classes need
    torchvision), and the ``None`` its parent passes for it is dropped. Build
    it with ``image_processor=`` and ``tokenizer=``; images only, no videos.
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        processor.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)

    return type(f"{processor.__name__}ImagesOnly", (processor,), {"__init__": __init__, "__module__": __name__})


def images_only(processor: type, tokenizer: Any, patch_size: int) -> Any:
    """A Qwen-VL ``processor`` over ``tokenizer`` and the pillow image processor, with no video processor.

    The Qwen-VL processors take a video processor, whose classes need
    torchvision; this one is built without (``without_videos``). Images are
    resized to between 4 and 16 merged squares (``patch_size * 2`` pixels a
    side) of area; images only, no videos.
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    side = patch_size * 2
    images = Qwen2VLImageProcessorPil(patch_size=patch_size, min_pixels=(2 * side) ** 2, max_pixels=(4 * side) ** 2)
    return without_videos(processor)(image_processor=images, tokenizer=tokenizer)
