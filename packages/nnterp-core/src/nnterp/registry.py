"""The plugin registry: which families are installed, and which one a model belongs to.

Plugins are found through the entry-point group ``nnterp``, once, lazily, on
first need; core's own suites are a plugin too (:mod:`.core_plugin`). Every
hook is called through pluggy, one implementation at a time, so a plugin that
fails to import or whose hook raises is recorded (name, distribution, error)
and warned about, and the others keep working. Tests and notebooks register a
plugin object directly with :meth:`Registry.register`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from . import core_plugin, hookspecs
from .family import FamilyError, declared

ENTRY_POINT_GROUP = "nnterp"

#: The entry-point group in which a plugin's distribution names each model type it serves (``model_type =
#: "package.families.family"``). It is read from the installed metadata without importing the plugin, so a model
#: whose plugin failed to import is told which distribution that is.
MODEL_TYPES_GROUP = "nnterp.model_types"

#: The official plugins and what each serves, named when no installed distribution serves a model type. A new
#: family is declared in its plugin's metadata; only a new plugin distribution is added here.
OFFICIAL_PLUGINS = {
    "nnterp-attention": "attention transformers, their mixtures of experts and vision-language models",
    "nnterp-deltanet": "gated DeltaNet hybrids: Qwen3-Next, Qwen3.5, OLMo-Hybrid, Kimi-Linear",
    "nnterp-mamba": "Mamba-1: Mamba, Falcon-Mamba, Jamba, Zamba",
    "nnterp-ssd": "Mamba-2: Mamba-2, Nemotron-H, Bamba, Falcon-H1, Zamba2, Granite-4",
    "nnterp-rwkv": "RWKV",
    "nnterp-rglru": "RG-LRU: RecurrentGemma",
    "nnterp-xlstm": "mLSTM: xLSTM",
    "nnterp-shortconv": "short convolutions: LFM2",
    "nnterp-lightning": "lightning attention: MiniMax",
}


def declared_model_types() -> dict[str, tuple[str | None, str]]:
    """Every model type an installed distribution declares in :data:`MODEL_TYPES_GROUP`: its distribution and family module."""
    return {
        entry_point.name: (entry_point.dist.name if entry_point.dist else None, entry_point.value)
        for entry_point in importlib.metadata.entry_points(group=MODEL_TYPES_GROUP)
    }


def installed(distribution: str) -> bool:
    """Whether ``distribution`` is installed."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


#: Each hook, and what a plugin that does not implement it provides.
HOOKS: dict[str, Callable[[], Any]] = {
    "nnterp_families": list,
    "nnterp_namespace": dict,
    "nnterp_suites": dict,
}


class PluginError(RuntimeError):
    """A plugin conflict, or a lookup no installed plugin answers."""


class UnknownModelType(PluginError):
    """No installed plugin handles a model's ``model_type``.

    ``distribution`` is the installed distribution that declares the type
    (:data:`MODEL_TYPES_GROUP`) but whose plugin did not provide its family,
    if any; ``reasons`` what each plugin that builds generic families found
    instead.
    """

    def __init__(self, message: str, distribution: str | None = None, reasons: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.distribution = distribution
        self.reasons = reasons


class ForeignModel(PluginError):
    """A model of a type a family serves, built from classes that are not the family's: another package registered
    its own model for that type in transformers' Auto classes (flash-linear-attention does, for Mamba and Mamba-2)."""


class Unrecognized(PluginError):
    """A plugin's generic family does not recognize a model's layout; the message says what it found."""


class UnknownFamily(PluginError, AttributeError):
    """No installed plugin provides a family of that name."""


@dataclass
class PluginInfo:
    """One registered plugin: its name, where it came from, and what it provides."""

    name: str
    distribution: str | None
    version: str | None
    module: Any
    families: list[ModuleType] = field(default_factory=list)


@dataclass
class PluginFailure:
    """A plugin whose module raised on import."""

    name: str
    distribution: str | None
    version: str | None
    error: str


class Registry:
    """The installed plugins, and the families, names and suites they provide."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.failures: list[PluginFailure] = []
        self._sources: dict[str, tuple[str | None, str | None]] = {core_plugin.NAME: core_plugin.distribution()}
        self.manager.register(core_plugin, name=core_plugin.NAME)
        self._loaded = False
        self._index: dict[str, Any] | None = None

    # -- plugins -------------------------------------------------------------

    def load(self) -> None:
        """Import every plugin of the entry-point group, once; record the ones that fail."""
        if self._loaded:
            return
        self._loaded = True
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            distribution = entry_point.dist.name if entry_point.dist else None
            version = entry_point.dist.version if entry_point.dist else None
            if self.manager.has_plugin(entry_point.name):
                continue
            self._sources[entry_point.name] = (distribution, version)
            try:
                module = entry_point.load()
            except Exception as error:
                self._fail(entry_point.name, error, "to import")
                continue
            self.manager.register(module, name=entry_point.name)
        self._index = None

    def register(self, plugin: Any, name: str | None = None) -> str:
        """Register a plugin object directly, without an entry point; returns its name."""
        self.load()
        registered = self.manager.register(plugin, name=name)
        self._index = None
        return registered

    def unregister(self, name: str) -> None:
        """Remove a plugin registered under ``name``."""
        self.manager.unregister(name=name)
        self._sources.pop(name, None)
        self.failures = [failure for failure in self.failures if failure.name != name]
        self._index = None

    def plugins(self) -> list[PluginInfo]:
        """Every working plugin with its distribution, version and families."""
        return list(self.index["plugins"])

    def plugin_of(self, family: ModuleType) -> PluginInfo | None:
        """The plugin that registered ``family``, or ``None`` for one registered by hand."""
        return next((info for info in self.plugins() if family in info.families), None)

    # -- what plugins provide ------------------------------------------------

    def _fail(self, name: str, error: BaseException, when: str) -> None:
        distribution, version = self._sources.get(name, (None, None))
        failure = PluginFailure(name, distribution, version, f"{type(error).__name__}: {error}")
        if failure in self.failures:
            return
        self.failures.append(failure)
        warnings.warn(
            f"nnterp plugin {name!r} (distribution {distribution}) failed {when} and is skipped: {failure.error}",
            stacklevel=3,
        )

    def _provided(self, name: str, plugin: Any) -> dict[str, Any] | None:
        """What one plugin's hooks return, or ``None`` (recorded as a failure) when one of them raises."""
        provided: dict[str, Any] = {}
        for hook, nothing in HOOKS.items():
            try:
                answers = [implementation.function() for implementation in self._implementations(hook, plugin)]
            except Exception as error:
                self._fail(name, error, f"in its {hook} hook")
                return None
            provided[hook] = next(filter(None, answers), None) or nothing()
        return provided

    def _implementations(self, hook: str, plugin: Any | None = None) -> list[pluggy.HookImpl]:
        """``hook``'s implementations, of one plugin or of all, in the order pluggy calls them (last registered first)."""
        implementations = getattr(self.manager.hook, hook).get_hookimpls()[::-1]
        return [
            implementation for implementation in implementations if plugin is None or implementation.plugin is plugin
        ]

    def _build_index(self) -> dict[str, Any]:
        self.load()
        infos: list[PluginInfo] = []
        families: dict[str, ModuleType] = {}
        owners: dict[str, str] = {}
        by_model_type: dict[str, ModuleType] = {}
        namespace: dict[str, tuple[str, Any]] = {}
        suites: dict[type, type] = {}
        for plugin_name, plugin in self.manager.list_name_plugin():
            provided = self._provided(plugin_name, plugin)
            if provided is None:
                continue
            try:
                for family in provided["nnterp_families"]:
                    declared(family)
            except FamilyError as error:
                self._fail(plugin_name, error, "to declare its families")
                continue
            distribution, version = self._sources.get(plugin_name, (None, None))
            infos.append(PluginInfo(plugin_name, distribution, version, plugin, list(provided["nnterp_families"])))
            for family in provided["nnterp_families"]:
                name = family_name(family)
                if name in families and families[name] is not family:
                    raise PluginError(
                        f"plugins {owners[name]!r} and {plugin_name!r} both provide a family named {name!r}; "
                        f"uninstall one of them"
                    )
                families[name] = family
                owners[name] = plugin_name
                for model_type in family.MODEL_TYPES:
                    if model_type in by_model_type and by_model_type[model_type] is not family:
                        other = family_name(by_model_type[model_type])
                        raise PluginError(
                            f"model_type {model_type!r} is claimed by two plugins: {owners[other]!r} "
                            f"(family {other}) and {plugin_name!r} (family {name}); uninstall one of them"
                        )
                    by_model_type[model_type] = family
            for key, value in provided["nnterp_namespace"].items():
                if key in namespace and namespace[key][1] is not value:
                    raise PluginError(f"plugins {namespace[key][0]!r} and {plugin_name!r} both add nnterp.{key}")
                namespace[key] = (plugin_name, value)
            suites.update(provided["nnterp_suites"])
        return {
            "plugins": infos,
            "families": families,
            "owners": owners,
            "model_types": by_model_type,
            "namespace": {key: value for key, (_, value) in namespace.items()},
            "suites": suites,
        }

    @property
    def index(self) -> dict[str, Any]:
        if self._index is None:
            self._index = self._build_index()
        return self._index

    def families(self) -> dict[str, ModuleType]:
        """Every installed family by name."""
        return dict(self.index["families"])

    def family(self, name: str) -> ModuleType:
        """The family called ``name`` (``"llama"``, ``"qwen3_5_text"``)."""
        families = self.index["families"]
        if name not in families:
            serving = self.index["model_types"].get(name)
            hint = (
                self._hint(name)
                if serving is None
                else f". {name!r} is a model type, served by the family {family_name(serving)!r}: name that"
            )
            raise UnknownFamily(
                f"no installed nnterp plugin provides a family named {name!r}; installed families: "
                f"{', '.join(sorted(families)) or '(none)'}" + hint
            )
        return families[name]

    def family_for(self, model_type: str, config: Any = None) -> ModuleType:
        """The family that handles ``model_type``: a plugin's named family, else, given the model's ``config``, a generic one.

        A generic family is built by a plugin that recognizes the layout of the
        model's blocks (``nnterp_generic_family``); its module has ``GENERIC``,
        the layout it recognized.

        Raises:
            UnknownModelType: no plugin names the type and none recognizes
                its layout; the message says what each plugin found.
        """
        by_model_type = self.index["model_types"]
        if model_type in by_model_type:
            return by_model_type[model_type]
        reasons = []
        declared_by = declared_model_types().get(model_type, (None, None))[0]
        if config is not None and declared_by is None:
            for implementation in self._implementations("nnterp_generic_family"):
                try:
                    answer = implementation.function(config=config)
                except Exception as error:
                    self._fail(implementation.plugin_name, error, "in its nnterp_generic_family hook")
                    continue
                if isinstance(answer, ModuleType):
                    return answer
                if answer is not None:
                    reasons.append(str(answer))
        plugins = ", ".join(f"{info.name} ({info.distribution or 'registered directly'})" for info in self.plugins())
        found = "".join(f"; its blocks are not a layout a generic family serves: {reason}" for reason in reasons)
        fix = (
            ". Write a family for it (a module with MODEL_TYPES, ENVOYS, RENAME, TINY_CONFIG; see the README's "
            "'Writing a family') and register it with nnterp.REGISTRY.register or a plugin's entry point"
            if reasons
            else ""
        )
        raise UnknownModelType(
            f"no installed nnterp plugin handles model_type {model_type!r}; installed plugins: {plugins or '(none)'}"
            + self._hint(model_type)
            + found
            + fix,
            declared_by,
            tuple(reasons),
        )

    def generic_plugins(self) -> list[str]:
        """The plugins that build generic families for model types no family names."""
        self.load()
        return [implementation.plugin_name for implementation in self._implementations("nnterp_generic_family")]

    def _hint(self, model_type: str) -> str:
        """Where a family for ``model_type`` is: the installed distribution that declares it, or the official plugins
        not installed."""
        distribution, module = declared_model_types().get(model_type, (None, None))
        if distribution is None:
            absent = [name for name in OFFICIAL_PLUGINS if not installed(name)]
            if not absent:
                return ""
            listed = "; ".join(f"{name} ({OFFICIAL_PLUGINS[name]})" for name in absent)
            install = absent[0] if len(absent) == 1 else "<the one that serves the model's blocks>"
            return (
                f". No installed distribution declares it; the official plugins not installed here are {listed}. "
                f"pip install {install}"
            )
        failed = [failure for failure in self.failures if failure.distribution == distribution]
        if failed:
            return "".join(
                f". {distribution} declares it (family {module}), but its plugin {failure.name!r} failed and is "
                f"skipped: {failure.error}. Fix that error, or reinstall {distribution}"
                for failure in failed
            )
        return (
            f". {distribution} declares it (family {module}), but its plugin did not provide that family: the "
            f"installed transformers lacks the model, or {distribution}'s installed metadata is stale (reinstall it)"
        )

    def namespace(self) -> dict[str, Any]:
        """The names plugins add to ``nnterp``."""
        return self.index["namespace"]

    def suites(self) -> dict[type, type]:
        """Conformance suites by the envoy class they test."""
        return dict(self.index["suites"])


def family_name(family: ModuleType) -> str:
    """A family's name: the last dotted part of its module name."""
    return family.__name__.rsplit(".", 1)[-1]


#: The process's registry.
REGISTRY = Registry()


def installed_families(*names: str) -> list[ModuleType]:
    """The family modules ``names`` (dotted) whose transformers model the installed transformers has.

    For a plugin's ``nnterp_families``: a family of a model added in a later
    transformers release imports a modeling module an earlier release lacks.
    It is left out there, so the plugin's other families keep working and
    ``nnterp coverage`` shows the type as absent; any other import error is
    raised, as a plugin's own bug should be.
    """
    families = []
    for name in names:
        try:
            families.append(importlib.import_module(name))
        except ModuleNotFoundError as error:
            if not (error.name or "").startswith("transformers.models."):
                raise
    return families
