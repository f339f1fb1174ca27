"""Core's own plugin: the conformance suites of the standard envoys core defines.

Registered by every :class:`~nnterp.registry.Registry` under the name
``nnterp``, as pytest registers its own plugins, so ``nnterp check`` and a
family's tests find core's suites where they find every plugin's: by the envoy
class each tests, through ``nnterp_suites``.
"""

from __future__ import annotations

import importlib.metadata

from .hookspecs import hookimpl

#: The name core's plugin is registered under.
NAME = "nnterp"


def distribution() -> tuple[str | None, str | None]:
    """The distribution core is installed from and its version; ``(None, None)`` for a source tree on the path."""
    try:
        return "nnterp-core", importlib.metadata.version("nnterp-core")
    except importlib.metadata.PackageNotFoundError:
        return None, None


@hookimpl
def nnterp_suites() -> dict[type, type]:
    """Every block's suite, and those of the mixtures of experts, hyper-connection blocks and vision towers."""
    from .components.layer import Layer
    from .components.moe import Moe
    from .components.streams import HyperConnectionLayer
    from .components.vision import Vision
    from .testing import HyperConnectionSuite, LayerSuite, MoeSuite
    from .testing.vision import VisionSuite

    return {Layer: LayerSuite, Moe: MoeSuite, HyperConnectionLayer: HyperConnectionSuite, Vision: VisionSuite}
