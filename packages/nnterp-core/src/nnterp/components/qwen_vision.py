"""The Qwen ViT (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5): packed, its merger inside, at ``model.visual``."""

from __future__ import annotations

from typing import Any

from ..availability import Unavailable
from ..order import standard_path
from .vision import ANY_RESOLUTION, Vision


class QwenVision(Vision):
    """The Qwen ViT: every image's patches packed into one row, [1, patches, vision_hidden_size].

    The tower runs on [patches, vision_hidden_size], the patches of every image
    of the invoke concatenated, so its stream values are served with 1 in the
    images axis, and its blocks' attention is a ``QwenVisionAttention``.

    The processor cuts each image into ``patch_size`` squares (two frames
    deep) and lays them out in ``spatial_merge_size`` x ``spatial_merge_size``
    blocks, each block's patches consecutive, images one after another; the
    merger (the projector) folds each block into one image token. So the
    processor's ``image_grid_thw`` ([t, h, w] per image, in patches) splits the
    row, and an image's patches are in merge-block order, not raster order.
    Qwen2.5-VL's tower also permutes them into attention windows after the
    patch embedding: its blocks' values, ``tower_output`` and the merger's
    input and output are in window order (images still one after another), and
    the tower restores the merge-block order after the merger.

    ``patch_embeddings`` is the patch embedding's output, in the processor's
    order, before Qwen2.5-VL's window permutation and Qwen3-VL's learned
    position embedding. The tower has no final norm, so
    ``tower_output`` is the last block's stream, the merger's input; it is
    served at the tower's output, after the merger has run, so read
    ``projector.input`` and ``projector.output`` before it.

    Sizes are the vision config's: ``vision_hidden_size`` is the tower's width
    (Qwen2-VL's ``embed_dim``: its ``hidden_size`` is the merger's output),
    ``num_heads``, ``intermediate_size`` (Qwen2-VL's is
    ``embed_dim * mlp_ratio``), ``patch_size``, ``spatial_merge_size`` and
    ``window_size`` (Qwen2.5-VL's, in pixels). ``image_size`` is unavailable.
    """

    PATCH_EMBEDDINGS = "patch_embed.output"

    @property
    def vision_hidden_size(self) -> int:
        """Width of the tower's stream: Qwen2-VL's ``embed_dim``, the ``hidden_size`` of the later towers."""
        return getattr(self.config, "embed_dim", None) or self.config.hidden_size

    @property
    def num_heads(self) -> int:
        """Attention heads per block."""
        return self.config.num_heads

    @property
    def intermediate_size(self) -> int:
        """Width of the blocks' feed-forward: the config's, or ``embed_dim * mlp_ratio`` on Qwen2-VL."""
        size = getattr(self.config, "intermediate_size", None)
        return size if isinstance(size, int) else int(self.config.embed_dim * self.config.mlp_ratio)

    @property
    def spatial_merge_size(self) -> int:
        """Side of the square of patches the merger folds into one image token."""
        return self.config.spatial_merge_size

    @property
    def window_size(self) -> int | None:
        """Side of Qwen2.5-VL's attention windows, in pixels; ``None`` on a tower without windows."""
        return getattr(self.config, "window_size", None)

    def patches_per_image(self, inputs: Any) -> list[int]:
        """How many patches of the packed row each image has, in order: its [t, h, w] grid's, from ``image_grid_thw``.

        ``inputs`` is the processor's output; ``patch_embeddings[0].split(vision.patches_per_image(inputs))``
        gives one image's patches per piece (in merge-block order; in window order on Qwen2.5-VL's blocks).
        """
        return [int(patches) for patches in inputs["image_grid_thw"].prod(-1)]

    @property
    def image_size(self) -> int:
        """Unavailable: the tower takes any resolution."""
        raise Unavailable(f"image_size on {standard_path(self)}: {ANY_RESOLUTION}")
