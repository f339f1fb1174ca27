"""The hooks an nnterp plugin implements.

A plugin is a module declared in its distribution's entry-point group
``nnterp`` (``[project.entry-points.nnterp] mamba = "nnterp_mamba.plugin"``)
that implements any of these with ``@nnterp.hookimpl``. Every hook is called
on every plugin, one implementation at a time, and its results are collected;
core's own suites are the built-in plugin :mod:`nnterp.core_plugin`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pluggy

PROJECT = "nnterp"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def nnterp_families() -> list[ModuleType]:
    """The family modules this plugin provides.

    What a family module declares, and what each name means, is
    :class:`nnterp.family.Family`: ``MODEL_TYPES``, ``ENVOYS``, ``RENAME`` and
    ``TINY_CONFIG`` always, the rest where the family needs them. The registry
    checks every family against it when the plugin loads; a family declared
    wrongly fails its plugin with the family and the name. A family is
    reachable as ``nnterp.families.<last dotted name>``.
    """


@hookspec
def nnterp_namespace() -> dict[str, Any]:
    """Names this plugin adds to the ``nnterp`` namespace (``{"route_delta_rule": route_delta_rule}``).

    ``nnterp.<name>`` resolves through the registry, so core imports no plugin.
    Two plugins adding one name is an error naming both.
    """


@hookspec
def nnterp_suites() -> dict[type, type]:
    """Conformance suites by envoy class: ``{SelectiveScan: SelectiveScanSuite}``.

    ``nnterp check`` runs, on each family's tiny model, the suite of every
    standard envoy class the model's blocks are wrapped in (and their bases').
    """


@hookspec
def nnterp_generic_family(config: Any) -> ModuleType | Exception | None:
    """A family for a model whose ``model_type`` no plugin names, built from the layout of its modules.

    Called with the model's transformers config when no family claims its
    type. Return the family module (with ``GENERIC``, a line saying what
    layout it recognized), an :class:`nnterp.registry.Unrecognized` saying
    what the plugin found instead, or ``None`` when the config is nothing the
    plugin looks at. The first family returned serves the model.
    """
