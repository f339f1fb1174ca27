"""VisionAttention: a vision tower's softmax attention, the values of ``Attention`` over patches."""

from __future__ import annotations

from nnterp.components.vision import TowerPart, on_patches

from .attention import Attention


@on_patches
class VisionAttention(TowerPart, Attention):
    """A vision block's attention: ``attention_output`` over patches, the interior as on the text side.

    Its queries, keys, values and pattern are read inside transformers' eager
    attention, as on a text model's ``Attention``, with images in the batch
    axis and patches in the sequence axis; its sizes are read off the module,
    so they are the tower's. Every value is unavailable on a load no image
    reaches (``Vision.no_images``).
    """
