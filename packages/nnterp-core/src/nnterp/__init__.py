"""nnterp: one vocabulary of standard values for every transformers language model.

``StandardizedTransformer`` loads a model and wraps its modules in standard
envoys, so ``model.layers[i].layer_output`` or
``model.layers[i].self_attn.attention_probabilities`` reads and writes the live
model through nnsight on every family. Families come from plugins
(``nnterp-attention``, ``nnterp-deltanet``, ``nnterp-mamba``, ``nnterp-ssd``,
or a third party's), found through the entry-point group ``nnterp``; names a
plugin adds to this namespace (``nnterp.route_delta_rule``) resolve through the
registry.
"""

from __future__ import annotations

from typing import Any

from . import compatibility, families, layouts  # compatibility first: it warns on an unverified transformers
from .availability import Unavailable
from .census import Coverage, coverage
from .compatibility import UnverifiedTransformersWarning
from .components.call_site import needs_torch_kernels
from .components.layer import PARALLEL, POST_NORM_ATTENTION, POST_NORM_MLP, Layer, TupleLayer
from .components.mlp import Mlp
from .components.moe import Moe, Scoring, mixture_reason, needs_grouped_experts, no_shared_expert
from .components.per_call import per_call, pinned
from .components.per_token import needs_recurrent_routing
from .components.pixtral import PixtralVision
from .components.qwen_vision import QwenVision
from .components.recurrent import AdjointRoute, RecurrentMixer
from .components.routing import route_kernels
from .components.standard import Standard, Sublayer, axis_size, blocks_support, contribution
from .components.streams import HyperConnectionLayer, ManyStreams
from .components.vision import ImageScatter, PatchRows, Vision, VisionLayer, VisionMlp, image_token_id
from .descriptor import DerivedEProperty, EProperty, TokenEProperty, unavailable
from .hookspecs import hookimpl, hookspec
from .layouts import *  # noqa: F403
from .order import OrderError
from .registry import REGISTRY, ForeignModel, PluginError, UnknownFamily, UnknownModelType, Unrecognized
from .transformer import StandardizedTransformer

__version__ = "0.1.0"

__all__ = [
    "AdjointRoute",
    "Coverage",
    "DerivedEProperty",
    "EProperty",
    "ForeignModel",
    "HyperConnectionLayer",
    "ImageScatter",
    "Layer",
    "ManyStreams",
    "Mlp",
    "Moe",
    "OrderError",
    "PatchRows",
    "PixtralVision",
    "PARALLEL",
    "POST_NORM_ATTENTION",
    "POST_NORM_MLP",
    "PluginError",
    "QwenVision",
    "REGISTRY",
    "RecurrentMixer",
    "Standard",
    "Scoring",
    "StandardizedTransformer",
    "Sublayer",
    "TokenEProperty",
    "TupleLayer",
    "Unavailable",
    "UnknownFamily",
    "UnknownModelType",
    "Unrecognized",
    "UnverifiedTransformersWarning",
    "Vision",
    "VisionLayer",
    "VisionMlp",
    "axis_size",
    "blocks_support",
    "compatibility",
    "contribution",
    "coverage",
    "families",
    "hookimpl",
    "hookspec",
    "image_token_id",
    "layouts",
    "mixture_reason",
    "needs_grouped_experts",
    "needs_recurrent_routing",
    "needs_torch_kernels",
    "no_shared_expert",
    "per_call",
    "pinned",
    "route_kernels",
    "unavailable",
]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    namespace = REGISTRY.namespace()
    if name in namespace:
        return namespace[name]
    raise AttributeError(
        f"module 'nnterp' has no attribute {name!r}; names added by installed plugins: "
        f"{', '.join(sorted(namespace)) or '(none)'}"
    )
