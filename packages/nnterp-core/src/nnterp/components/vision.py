"""Vision towers: the image side of a multimodal model, and where its images meet the text model.

A multimodal wrapper runs its vision tower on the images, projects what the
tower returns into the text model's width, and scatters the result into the
token embeddings at the image tokens. ``Vision`` is the tower (``model.vision``),
its blocks are ``VisionLayer`` with a ``VisionAttention`` (in nnterp-attention,
beside ``Attention``) and a ``VisionMlp``, and their stream values are laid out
as ``Patches``: [images, patches, vision_hidden_size]. ``ImageScatter`` is the
module whose forward does the scatter; ``image_features`` and
``image_token_mask`` are read there, so

    model.layers[0].layer_input[image_token_mask] == model.vision.image_features

whatever the wrapper did to the features on the way (pooling, unpadding,
newline tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from nnsight.intervention.envoy import Envoy

from ..availability import Unavailable
from ..descriptor import EProperty
from ..family import declared
from ..layouts import ImageFeatures, ImageTokenMask, Neurons, Patches, PatchNeurons, Residual
from .layer import Layer
from .mlp import Mlp
from .standard import Standard, blocks_support

NO_PROCESSOR = (
    "no image reaches this model: it was loaded without a processor (task={task!r}), so a trace takes text "
    "only; load it with its processor: StandardizedTransformer(path) on a checkpoint that saves one, or "
    "StandardizedTransformer(path, processor=...)"
)
NO_PROJECTOR = (
    "the family {family} names no projector for this wrapper, so where its images enter the text model is not "
    "known; alias the wrapper's projector as 'projector' in the family's RENAME"
)
NO_SCATTER = (
    "this tower's parent ({parent}) is not where the image features are scattered into the text embeddings: "
    "the family keys ImageScatter on that module's type, or sets ROOT_SCATTER when the root's forward scatters"
)
NO_TOWER = (
    "this load of {family} has no vision tower ({model}); load the checkpoint with its processor, which builds "
    "the multimodal wrapper (StandardizedTransformer(path, processor=...))"
)
#: The standard names of a wrapper's image side on the root.
VISION_NAMES = ("vision", "projector")
#: Where a tower's image_size is not one number.
ANY_RESOLUTION = "the tower takes any resolution: each image keeps its own grid of patches"


class PatchRows(EProperty):
    """A tower value served one row of patches per image, whatever shape the tower's own tensor has.

    A convolution's grid ``[images, width, height, width]`` is served flattened,
    a packed tower's ``[patches, width]`` with a leading 1 (one row holds every
    image); both are views, so in-place edits land, and an assignment is put
    back in the tower's own shape.
    """

    def _rows(self, obj: Envoy, element: Any) -> Any:
        if not isinstance(element, torch.Tensor):
            return element
        if element.dim() == 4:
            return element.flatten(2).transpose(1, 2)
        if element.dim() == 2:
            return element.unsqueeze(0)
        return element

    def _whole(self, obj: Envoy, current: Any, value: Any) -> Any:
        if not isinstance(current, torch.Tensor) or not isinstance(value, torch.Tensor):
            return value
        if current.dim() == 4:
            return value.transpose(1, 2).reshape(current.shape)
        return value.reshape(current.shape)


def on_patches(cls: type) -> type:
    """Lay out every stream value of a tower envoy class as ``Patches`` (its neurons as ``PatchNeurons``).

    The text-side class declares them as [batch, seq, hidden_size]; in a tower
    the rows are images and the width is the tower's.
    """
    for name, value in cls.values().items():
        if value.layout is Residual:
            setattr(cls, name, value.laid_out(Patches, kind=PatchRows))
        elif value.layout is Neurons:
            setattr(cls, name, value.laid_out(PatchNeurons, kind=PatchRows))
    return cls


def tower(envoy: Envoy) -> Vision:
    """The vision tower ``envoy`` is part of."""
    node: Envoy | None = envoy
    while node is not None and not isinstance(node, Vision):
        node = node.parent
    if node is None:
        raise ValueError(f"{envoy.path} is not inside a vision tower")
    return node


#: The order a multimodal forward produces its values in, for a read the run never served.
TOWER_ORDER = (
    "a vision tower's values exist only in a run whose input carries images (the processor's pixel_values), "
    "and the tower runs before the text model: patch_embeddings, each tower block in turn, tower_output, the "
    "projector, then image_features and image_token_mask at the scatter into the embeddings, then the text "
    "model's blocks; read them in that order, in a trace given images"
)


class TowerPart(Standard):
    """A vision tower or an envoy inside one: it serves nothing on a load no image reaches (``Vision.no_images``)."""

    def absent(self) -> str | None:
        return tower(self).no_images()

    def order_hint(self, name: str) -> str:
        """What a read the run did not serve is told: the tower runs on images only, before the text model."""
        return TOWER_ORDER


@on_patches
class VisionLayer(TowerPart, Layer):
    """A block of a vision tower: the values of a ``Layer``, over patches.

    ``layer_input + attention_output + mlp_output == layer_output`` holds as in
    the text model; the stream is [images, patches, vision_hidden_size].
    """


@on_patches
class VisionMlp(TowerPart, Mlp):
    """A vision block's feed-forward: the values of an ``Mlp``, over patches."""


class ReadOnly(EProperty):
    """A value that describes the input rather than carrying the computation; it is read, never written."""

    def __set__(self, obj: Envoy, value: Any) -> None:
        raise AttributeError(f"{self.name} is read-only: {self.description}")


def scatter_operation(host: Envoy) -> str | None:
    """The operation in ``host``'s forward that scatters image features into the embeddings, or ``None``."""
    if isinstance(host, ImageScatter):
        return type(host).SCATTER
    if host is host.root:
        return declared(host.family).ROOT_SCATTER
    return None


def _scatter(vision: Vision) -> str:
    return f"../source.{scatter_operation(vision.parent)}.inputs"


def _no_scatter(vision: Vision) -> str | None:
    parent = vision.parent
    if scatter_operation(parent) is None:
        return NO_SCATTER.format(parent=type(parent._module).__name__)
    return None


class ImageFeatureRows(EProperty):
    """``image_features``: served one row per image token (a view of the scattered tensor), put back in its shape."""

    def _rows(self, obj: Envoy, element: Any) -> Any:
        return element.reshape(-1, element.shape[-1]) if isinstance(element, torch.Tensor) else element

    def _whole(self, obj: Envoy, current: Any, value: Any) -> Any:
        if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
            return value.to(current.dtype).reshape(current.shape)
        return value


class Vision(TowerPart):
    """A multimodal model's vision tower (``model.vision``): its blocks are ``layers``, its sizes its own config's.

    ``patch_embeddings`` is the patch embedding's output, one row per patch,
    before any position embedding, CLS token or pre-norm; ``tower_output`` is
    what the tower returns as its last hidden state, after its final norm where
    it has one and before any pooling or CLS dropping. What reaches the
    projector can differ (LLaVA takes ``layers[-2].layer_output`` and drops the
    CLS token; Gemma-3 pools): read ``projector.input`` for that.

    Where the images meet the text model, read at the scatter in the wrapper's
    forward: ``image_features`` and ``image_token_mask``, with
    ``model.layers[0].layer_input[image_token_mask] == image_features``.

    The sizes keep the plain names (``num_heads``, ``head_dim``, ``num_layers``,
    ``intermediate_size``) and shadow the text model's on purpose, so the
    tower's values find the tower's numbers; its width is
    ``vision_hidden_size``, apart from the text model's ``hidden_size``, which
    ``image_features`` is laid out in. A tower whose config spells a size its
    own way overrides the property.

    Every value raises :class:`~nnterp.Unavailable` on a load no image reaches
    (``no_images``), and ``support()`` is then empty.
    """

    #: Where the patch embedding's output is read: the convolution of SigLIP and CLIP.
    PATCH_EMBEDDINGS: ClassVar[str | Callable[[Envoy], str]] = "embeddings.patch_embedding.output"
    #: Where the tower's last hidden state is read.
    TOWER_OUTPUT: ClassVar[str | Callable[[Envoy], str]] = "output"
    #: The field of the tower's output that is its last hidden state, or ``None`` for the output itself.
    TOWER_OUTPUT_FIELD: ClassVar[str | None] = "last_hidden_state"

    # -- sizes ------------------------------------------------------------------------

    @property
    def config(self) -> Any:
        """The tower's own config (the wrapper's ``vision_config``)."""
        return self._module.config

    @property
    def num_layers(self) -> int:
        """Number of blocks in the tower."""
        return len(self.layers)

    @property
    def vision_hidden_size(self) -> int:
        """Width of the tower's stream."""
        return self.config.hidden_size

    @property
    def num_heads(self) -> int:
        """Attention heads per block."""
        return self.config.num_attention_heads

    @property
    def head_dim(self) -> int:
        """Width of one head: the config's ``head_dim`` when it says, else ``vision_hidden_size // num_heads``."""
        head_dim = getattr(self.config, "head_dim", None)
        return head_dim if isinstance(head_dim, int) else self.vision_hidden_size // self.num_heads

    @property
    def intermediate_size(self) -> int:
        """Width of the blocks' feed-forward."""
        return self.config.intermediate_size

    @property
    def patch_size(self) -> int:
        """Side of a patch, in pixels."""
        return self.config.patch_size

    @property
    def image_size(self) -> int:
        """Side of the square image the tower is built for, in pixels."""
        return self.config.image_size

    @property
    def image_token_id(self) -> int | None:
        """The id of the token the processor puts where an image's features go."""
        return image_token_id(self.root._module.config)

    # -- whether images reach it ----------------------------------------------------------

    def no_images(self) -> str | None:
        """Why no image reaches the model this tower belongs to, or ``None``: the one place that decides."""
        root = self.root
        family = getattr(root, "family", None)
        broken = declared(family).NO_IMAGES
        if broken is not None:
            return broken
        if getattr(root, "processor", None) is None:
            return NO_PROCESSOR.format(task=getattr(root, "task", None))
        if not isinstance(getattr(root, "projector", None), Envoy):
            return NO_PROJECTOR.format(family=getattr(family, "__name__", "?"))
        return None

    def support(self, layer: int | None = None) -> dict[str, Any]:  # type: ignore[override]
        """Which tower values this load has, as ``StandardizedTransformer.support`` reports the text model's.

        The tower's own values (``patch_embeddings``, ``image_features``, ...)
        and every block value over ``layers`` (``"layer_output"``,
        ``"self_attn.attention_probabilities"``): ``None`` when available on
        every block, else ``{layer: reason}``. With ``layer``, that block's
        values alone. Empty on a load no image reaches (``no_images``).
        """
        if self.no_images() is not None:
            return {}
        blocks = list(self.layers)
        if layer is not None:
            return blocks_support(blocks, layer)
        return {**super().support(), **blocks_support(blocks)}

    # -- values ---------------------------------------------------------------------------

    @PatchRows(lambda vision: type(vision).PATCH_EMBEDDINGS)
    def patch_embeddings(self, value: Any) -> Patches:
        """The patch embedding's output, one row per patch, [images, patches, vision_hidden_size].

        Before any position embedding, CLS token or pre-norm the tower adds;
        patches in raster order. Assign, or edit in place.
        """
        return value

    @PatchRows(lambda vision: type(vision).TOWER_OUTPUT, select=lambda vision: type(vision).TOWER_OUTPUT_FIELD)
    def tower_output(self, value: Any) -> Patches:
        """The tower's last hidden state, [images, patches, vision_hidden_size].

        After the tower's final norm where it has one; before any pooling, CLS
        dropping or projection. Assign, or edit in place.
        """
        return value

    @ImageFeatureRows(_scatter, select=1, unavailable=_no_scatter)
    def image_features(self, value: Any) -> ImageFeatures:
        """What the text model receives at the image tokens, [image_tokens, hidden_size].

        The features the wrapper scatters into the token embeddings, every
        image token of the batch in order, so
        ``layers[0].layer_input[image_token_mask] == image_features``. Assign a
        tensor of the same shape, or edit in place, to change what the text
        model sees of the images.
        """
        return value

    @ReadOnly(_scatter, select=0, unavailable=_no_scatter)
    def image_token_mask(self, value: Any) -> ImageTokenMask:
        """Which positions of the prompt receive image features, [batch, seq]; read-only.

        The mask the wrapper scatters ``image_features`` with, so it marks
        exactly the positions the text model receives them at.
        """
        return value[..., 0] if value.dim() == 3 else value


class ImageScatter(Standard):
    """A wrapper's module whose forward scatters the image features into the token embeddings.

    Keyed by a family on the wrapper's inner model (``LlavaModel``); the
    tower under it serves ``image_features`` and ``image_token_mask`` at
    ``SCATTER``, ``inputs_embeds.masked_scatter(mask, features)``. Its forward
    is instrumented when the envoy is built, because the scatter is read after
    the tower's values, which run inside the same forward. A wrapper whose
    root does the scatter (Llama-4) sets ``ROOT_SCATTER`` on its family
    instead. It carries no values of its own.
    """

    sourced = True
    #: The operation that scatters the features: its arguments are the mask and the features.
    SCATTER: ClassVar[str] = "inputs_embeds_masked_scatter_0"


def image_token_id(config: Any) -> int | None:
    """The id of the token the processor puts where an image's features go (``image_token_index`` on older configs)."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def check_images(config: Any, arguments: tuple[tuple, dict]) -> None:
    """Raise before the model runs when a forward's input has image tokens and no image, or images and no token.

    The wrapper would otherwise embed the image tokens as text, or drop the
    images, and every image value would silently describe nothing.
    """
    token = image_token_id(config)
    kwargs = arguments[1] if isinstance(arguments, tuple) and len(arguments) == 2 else {}
    ids = kwargs.get("input_ids") if isinstance(kwargs, dict) else None
    if token is None or not isinstance(ids, torch.Tensor):
        return
    tokens = int((ids == token).sum())
    images = kwargs.get("pixel_values") is not None
    if tokens and not images:
        raise ValueError(
            f"the input has {tokens} image token(s) (id {token}) but no image: pass the images with the text, "
            "model.trace(text=prompt, images=[...]) or the processor's output, or remove the image tokens"
        )
    if images and not tokens:
        raise ValueError(
            f"the input carries images but no image token (id {token}) to put them at: write the processor's "
            "image placeholder in the prompt and pass both through the processor"
        )


def vision_family(family: Any) -> bool:
    """Whether ``family`` serves a vision tower (it keys a ``Vision`` on one of its modules)."""
    return any(isinstance(envoy, type) and issubclass(envoy, Vision) for envoy in family.ENVOYS.values())


class MissingTower(Unavailable, AttributeError):
    """``model.vision`` on a load without a tower: unavailable, and absent to ``hasattr`` and ``getattr(..., default)``."""


def missing_tower(model: Any, name: str) -> MissingTower:
    """The error for ``model.vision`` on a load without a tower (a text-only load of a multimodal checkpoint)."""
    return MissingTower(f"{name}: " + NO_TOWER.format(family=model.family.__name__, model=type(model._module).__name__))
