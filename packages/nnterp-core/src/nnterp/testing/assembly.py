"""Which conformance suites a family gets: the one place that decides, for ``nnterp check`` and for pytest.

Every suite is registered by the envoy class it tests, through the plugins'
``nnterp_suites`` hook (core's own through its built-in plugin), and a family
gets the suite of every envoy class its tiny model has. ``LayerSuite`` checks
that a hand-assembled test class runs exactly these.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..family import declared
from ..registry import REGISTRY, family_name


def suite_for(family: ModuleType, model: Any) -> type:
    """The conformance suite class of a family: the suite of every standard envoy ``model`` has (its blocks' included).

    ``model`` (a tiny model of the family) only says which envoys the family uses; the suite builds its own.
    """
    from .vision import VisionSuite

    envoy_types = {type(envoy) for envoy in model.modules()}
    suites: list[type] = []
    for envoy_class, suite in REGISTRY.suites().items():
        if suite not in suites and any(issubclass(kind, envoy_class) for kind in envoy_types):
            suites.append(suite)
    # A suite that extends another (a packed tower's VisionSuite, a hyper-connection block's LayerSuite) replaces it.
    suites = [suite for suite in suites if not any(other is not suite and issubclass(other, suite) for other in suites)]
    # The vision suite first: it builds the model with its processor, where the text side's suites run too.
    suites.sort(key=lambda suite: not issubclass(suite, VisionSuite))
    # A generic family is registered under no name, so its suite holds the module itself.
    named = family if declared(family).GENERIC else family_name(family)
    return type(f"Check_{family_name(family)}", tuple(suites), {"family": named})
