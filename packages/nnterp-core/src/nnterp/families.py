"""``nnterp.families.<name>``: every installed family module, by name, resolved through the registry."""

from __future__ import annotations

from types import ModuleType

from .registry import REGISTRY


def __getattr__(name: str) -> ModuleType:
    if name.startswith("__"):
        raise AttributeError(name)
    return REGISTRY.family(name)


def __dir__() -> list[str]:
    return sorted(REGISTRY.families())
