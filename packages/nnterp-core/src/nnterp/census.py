"""The coverage census: which of the installed transformers' causal language models a family serves.

Read off the installed transformers, without importing a modeling module or
building a model: its causal-LM model types (``AutoModelForCausalLM``'s
mapping), the family the plugin registry has for each, and the recurrent
kernels each modeling module declares (a hub kernel of flash-linear-attention
or mamba_ssm, the packages of the recurrent mixers), so that a recurrent model
no family serves stands out. ``nnterp coverage`` prints it.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from transformers.models.auto.configuration_auto import model_type_to_module_name
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .registry import REGISTRY, UnknownModelType, family_name

#: The packages whose hub kernels are recurrent mixers' (a gated delta rule, KDA, a selective or chunk scan).
RECURRENT_PACKAGES = ("fla", "mamba_ssm")
#: transformers' declaration of a kernel it takes from the hub: ``("kernel name", "package")``.
HUB_KERNEL = re.compile(r'use_kernel_func_from_hub_with_fallback\(\s*"([^"]+)",\s*"([^"]+)"')


@dataclass(frozen=True)
class Coverage:
    """One causal-LM model type of the installed transformers, and whether nnterp serves it."""

    model_type: str
    #: The family serving it (``nnterp.families.<family>``) and the plugin that registers it; ``None`` if none does.
    family: str | None
    plugin: str | None
    #: The recurrent hub kernels its modeling module declares: empty for a model with no recurrent mixer.
    recurrent_kernels: tuple[str, ...]

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
        for name, package in HUB_KERNEL.findall(path.read_text()):
            if package in RECURRENT_PACKAGES:
                kernels.add(name)
    return tuple(sorted(kernels))


def coverage() -> list[Coverage]:
    """Every causal-LM model type of the installed transformers, in its mapping's order, with what serves it."""
    plugin_of = {id(family): info.name for info in REGISTRY.plugins() for family in info.families}
    rows = []
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        try:
            family = REGISTRY.family_for(model_type)
        except UnknownModelType:
            family = None
        rows.append(
            Coverage(
                model_type,
                None if family is None else family_name(family),
                None if family is None else plugin_of.get(id(family)),
                recurrent_kernels(model_type),
            )
        )
    return rows
