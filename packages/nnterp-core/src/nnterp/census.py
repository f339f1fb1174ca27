"""The coverage census: which of the installed transformers' causal language models a family serves.

Read off the installed transformers, without loading a weight: its causal-LM
model types (``AutoModelForCausalLM``'s mapping, and the multimodal types a
family loads for text); the family the plugin
registry names for each or, for a type no family names, the generic family a
plugin recognizes from the layout of its tiny model's blocks (built on the
meta device), or why none does; and the recurrent kernels each modeling
module declares (a hub kernel of flash-linear-attention or mamba_ssm, the
packages of the recurrent mixers, read from its source), so that a recurrent
model no family serves stands out. ``nnterp coverage`` prints it.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers.models.auto.configuration_auto import model_type_to_module_name
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .family import declared
from .forward_source import hub_kernels
from .registry import REGISTRY, UnknownModelType, family_name

#: The packages whose hub kernels are recurrent mixers' (a gated delta rule, KDA, a selective or chunk scan).
RECURRENT_PACKAGES = ("fla", "mamba_ssm")


@dataclass(frozen=True)
class Coverage:
    """One causal-LM model type of the installed transformers, and whether nnterp serves it."""

    model_type: str
    #: The family serving it (``nnterp.families.<family>``, or the model type for a generic family) and the plugin
    #: that provides it; ``None`` if none does.
    family: str | None
    plugin: str | None
    #: The recurrent hub kernels its modeling module declares: empty for a model with no recurrent mixer.
    recurrent_kernels: tuple[str, ...]
    #: For a generic family, the block layout it recognized; ``None`` for a named family or none.
    generic: str | None = None
    #: Why no family serves it; ``None`` when one does.
    reason: str | None = None
    #: For a type no family serves whole, the kinds of layer a family serves alone (``layer_types`` entries): the
    #: model is partly served, and ``reason`` says what the other kinds lack.
    partly: tuple[str, ...] = ()

    @property
    def served(self) -> bool:
        return self.family is not None


def recurrent_kernels(model_type: str) -> tuple[str, ...]:
    """The recurrent hub kernels the modeling modules of ``model_type``'s directory declare, read from their source."""
    spec = importlib.util.find_spec(f"transformers.models.{model_type_to_module_name(model_type)}")
    if spec is None or not spec.submodule_search_locations:
        return ()
    kernels = set()
    for path in Path(spec.submodule_search_locations[0]).glob("modeling_*.py"):
        for _, name, package in hub_kernels(path):
            if package in RECURRENT_PACKAGES:
                kernels.add(name)
    return tuple(sorted(kernels))


def causal_lm_types() -> list[str]:
    """The model types a causal LM loads as: ``AutoModelForCausalLM``'s, in its order, then those a family loads for text.

    A family's ``CAUSAL_LM`` is a multimodal wrapper transformers maps to no
    causal LM (GLM-5-Next's), which nnterp loads for text: the type its config
    declares is counted, not the text config's the family also names.
    """
    types = list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    for family in REGISTRY.families().values():
        causal_lm = declared(family).CAUSAL_LM
        if causal_lm is not None and causal_lm.config_class.model_type not in types:
            types.append(causal_lm.config_class.model_type)
    return types


def coverage() -> list[Coverage]:
    """Every model type a causal LM loads as (``causal_lm_types``), with what serves it."""
    plugin_of = {id(family): info.name for info in REGISTRY.plugins() for family in info.families}
    generic_plugin = ", ".join(REGISTRY.generic_plugins()) or None
    rows = []
    for model_type in causal_lm_types():
        kernels = recurrent_kernels(model_type)
        config = tiny_config_of(model_type)
        try:
            family = serving(model_type, config)
        except UnknownModelType as error:
            partly = served_kinds(model_type) if config is not None else ()
            rows.append(Coverage(model_type, None, None, kernels, reason=why_not(error, config), partly=partly))
            continue
        generic = declared(family).GENERIC
        plugin = generic_plugin if generic else plugin_of.get(id(family))
        rows.append(Coverage(model_type, family_name(family), plugin, kernels, generic=generic))
    return rows


def served_kinds(model_type: str) -> tuple[str, ...]:
    """The kinds of layer in ``model_type``'s per-layer list that a family would serve in a model of that kind alone.

    A model is served only when every kind of layer its config can produce is
    (its tiny config has one of each, :func:`~nnterp.testing.shrink.tiny_overrides`);
    this names the part a family does serve, for a census line that says what is missing.
    """
    from transformers import AutoConfig

    from .testing.models import TOKEN_IDS
    from .testing.shrink import PER_LAYER_KINDS, tiny_overrides

    overrides = tiny_overrides(model_type)
    text = overrides.get("text_config", overrides)
    name = next((name for name in PER_LAYER_KINDS if name in text), None)
    kinds = list(dict.fromkeys(text[name])) if name else []
    if len(kinds) < 2:
        return ()
    served = []
    for kind in kinds:
        text[name] = [kind] * len(kinds)
        try:
            serving(model_type, AutoConfig.for_model(model_type, **{**TOKEN_IDS, **overrides}))
        except Exception:
            continue
        served.append(kind)
    return tuple(served)


def family_of(model_type: str) -> Any:
    """The family serving ``model_type``'s models: looked up by the type their config states (GPT-SW3's is GPT-2's).

    Raises:
        UnknownModelType: none does.
    """
    return serving(model_type, tiny_config_of(model_type))


def serving(model_type: str, config: Any) -> Any:
    """The family serving ``model_type`` given its tiny ``config`` (``None`` where none builds)."""
    return REGISTRY.family_for(model_type if config is None else config.model_type, config)


def tiny_config_of(model_type: str) -> Any:
    """The model type's default config with its sizes shrunk, the config a generic family is recognized from."""
    from transformers import AutoConfig

    from .testing.models import TOKEN_IDS
    from .testing.shrink import tiny_overrides

    try:
        return AutoConfig.for_model(model_type, **{**TOKEN_IDS, **tiny_overrides(model_type)})
    except Exception:
        return None


def why_not(error: UnknownModelType, config: Any) -> str:
    """Why a model type is not served, in one census line, from the registry's error and its tiny ``config``."""
    if error.distribution is not None:
        return f"its family is in {error.distribution}, whose plugin did not provide it"
    if error.reasons:
        # one line, as the census prints it: an import error's message spans several (timm's, for Gemma-3n's tower)
        return " ".join("; ".join(error.reasons).split())
    if config is None:
        return "its default config cannot be shrunk to a tiny one to read its layout"
    return "no installed plugin names it or recognizes it"


@dataclass(frozen=True)
class MixerKind:
    """A kind of recurrent mixer an installed plugin serves: what the README's mixer-kind table lists."""

    #: What the mixer is, in the model's own terms (its envoys' ``KIND``): ``"gated DeltaNet"``.
    kind: str
    plugin: str
    #: The envoy classes of this kind, and the families whose models have one.
    envoys: tuple[str, ...]
    families: tuple[str, ...]
    #: The standard values it serves beyond those every recurrent mixer shares.
    values: tuple[str, ...]
    #: What ``token_mixing`` reconstructs (its envoys' ``TOKEN_MIXING``).
    token_mixing: str


def mixer_kinds() -> list[MixerKind]:
    """Every kind of recurrent mixer the installed plugins' families wrap, with the values it serves."""
    from .components.recurrent import RecurrentMixer
    from .descriptor import EProperty

    shared = {name for name, value in vars(RecurrentMixer).items() if isinstance(value, EProperty)}
    found: dict[tuple[str, str], dict[str, set]] = {}
    for info in REGISTRY.plugins():
        for family in info.families:
            for envoy in declared(family).ENVOYS.values():
                if not (isinstance(envoy, type) and issubclass(envoy, RecurrentMixer)):
                    continue
                kind = found.setdefault((envoy.KIND, info.name), {"envoys": set(), "families": set(), "values": set()})
                kind["envoys"].add(envoy.__name__)
                kind["families"].add(family_name(family))
                kind["values"] |= {
                    name
                    for cls in envoy.__mro__[: envoy.__mro__.index(RecurrentMixer)]
                    for name, value in vars(cls).items()
                    if isinstance(value, EProperty) and not isinstance(value.unavailable, str) and name not in shared
                }
                kind["token_mixing"] = {envoy.TOKEN_MIXING}
    return sorted(
        (
            MixerKind(
                kind,
                plugin,
                *(tuple(sorted(held[part])) for part in ("envoys", "families", "values")),
                *held["token_mixing"],
            )
            for (kind, plugin), held in found.items()
        ),
        key=lambda kind: (kind.plugin, kind.kind),
    )


def reason_kind(reason: str) -> str:
    """A census reason's kind, for grouping: its first clause without the names and counts of the one model."""
    clause = re.split(r"[:;]", reason, maxsplit=1)[0]
    clause = re.sub(r", \w+ \(\w+\),", "", clause)
    clause = re.sub(r", of type '[^']*',", ",", clause)
    return re.sub(r" (\d+|None) ", " ", clause)


def markdown(rows: list[Coverage]) -> str:
    """The README's census tables, from ``coverage()`` and ``mixer_kinds()``: types by status, then mixer kinds."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        if row.generic:
            status = "served by the generic family"
        elif row.served:
            status = "served by a named family"
        elif row.partly:
            status = f"partly served: {reason_kind(row.reason)}"
        else:
            status = f"not served: {reason_kind(row.reason)}"
        groups.setdefault(status, []).append(row.model_type)
    lines = ["| | count | model types |", "|---|---|---|"]
    order = sorted(groups, key=lambda status: (not status.startswith("served"), status))
    lines += [f"| {status} | {len(groups[status])} | {', '.join(sorted(groups[status]))} |" for status in order]
    recurrent = [row for row in rows if row.recurrent_kernels]
    lines += [
        "",
        f"{sum(row.served for row in rows)} of {len(rows)} causal-LM model types served, "
        f"{sum(bool(row.generic) for row in rows)} of them by the generic family; "
        f"{sum(row.served for row in recurrent)} of the {len(recurrent)} with a recurrent hub kernel.",
        "",
        "| mixer kind | plugin | envoys | families | its own values | token_mixing |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {kind.kind} | {kind.plugin} | {', '.join(f'`{envoy}`' for envoy in kind.envoys)} | "
        f"{', '.join(kind.families)} | "
        f"{', '.join(f'`{value}`' for value in kind.values)} | {kind.token_mixing} |"
        for kind in mixer_kinds()
    ]
    return "\n".join(lines) + "\n"
