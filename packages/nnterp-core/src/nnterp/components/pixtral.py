"""Pixtral's vision tower (Mistral 3, LLaVA over Pixtral): packed, every image's patches in one row."""

from __future__ import annotations

from typing import Any

from ..availability import Unavailable
from ..order import standard_path
from .vision import ANY_RESOLUTION, Vision

#: Why a Pixtral tower has no one image size.
LARGEST_SIDE = (
    ANY_RESOLUTION
    + "; the config's image_size is the longest side the processor resizes an image down to, not a size every "
    "image has (read the processor's image_sizes)"
)


class PixtralVision(Vision):
    """Pixtral's tower: every image's patches packed into one row, [1, all patches, vision_hidden_size].

    The convolution runs on the batch padded to its largest image; each image
    is cropped to its own grid, and the grids are flattened in raster order
    and concatenated, image after image, into one row before ``ln_pre``. So
    ``patch_embeddings`` is that packed row as it enters ``ln_pre`` (the
    convolution's own output is still the padded grid), and every stream value
    has 1 in the images axis. The processor's ``image_sizes`` split the row:
    ``(height // patch_size) * (width // patch_size)`` patches per image, in
    order. The blocks attend under a block-diagonal mask, one attention call
    over the whole row, so ``attention_probabilities`` is
    [1, heads, all patches, all patches] and zero between images. The tower
    has no final norm: ``tower_output`` is the last block's stream.

    Sizes are the Pixtral vision config's plain ones; ``image_size`` is
    unavailable, since each image keeps its own grid.
    """

    PATCH_EMBEDDINGS = "ln_pre.input"

    def patches_per_image(self, inputs: Any) -> list[int]:
        """How many patches of the packed row each image has, in order: its grid, from the processor's ``image_sizes``.

        ``inputs`` is the processor's output; ``patch_embeddings[0].split(vision.patches_per_image(inputs))``
        gives one image's patches per piece.
        """
        patch = self.patch_size
        return [int(height) // patch * (int(width) // patch) for height, width in inputs["image_sizes"]]

    @property
    def image_size(self) -> int:
        """Unavailable: the tower takes any resolution, up to the config's image_size on the longest side."""
        raise Unavailable(f"image_size on {standard_path(self)}: {LARGEST_SIDE}")
