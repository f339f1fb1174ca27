"""Where a model placed by accelerate runs, and where its inputs go.

A model loaded with a ``device_map`` (some modules on a GPU, some on the CPU,
some on ``"disk"``) or wrapped by ``accelerate.cpu_offload`` keeps offloaded
weights on the meta device and runs each module on its hook's execution
device. Two things transformers' pipeline (which nnsight builds around the
model) would get wrong about it are done here instead:

- it takes the model's device from the first entry of the device map, which
  may be ``"disk"`` (not a torch device), and without a map it moves the whole
  model to one device, which fails on meta weights;
- inputs belong on the device the embedding runs on, not where the model's
  first parameter happens to be stored (the meta device when it is offloaded).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def execution_device(model: torch.nn.Module, module: torch.nn.Module) -> torch.device | None:
    """The device ``module`` of ``model`` computes on under accelerate's hooks, or ``None`` when no hook places it.

    The nearest hook at or above the module decides: a device map hooks the
    modules it names, ``cpu_offload`` every module with weights.
    """
    paths = {id(child): path for path, child in model.named_modules()}
    for prefix in ancestors(paths[id(module)]):
        hook = getattr(model.get_submodule(prefix), "_hf_hook", None)
        device = getattr(hook, "execution_device", None)
        if device is None:
            device = next((getattr(inner, "execution_device", None) for inner in getattr(hook, "hooks", ())), None)
        if device is not None:
            return torch.device(device)
    return None


def input_device(model: torch.nn.Module) -> torch.device:
    """Where the model's inputs go: the device its input embedding runs on (its weight's, when no hook places it)."""
    embedding = model.get_input_embeddings()
    return execution_device(model, embedding) or embedding.weight.device


def is_placed(model: torch.nn.Module) -> bool:
    """Whether accelerate placed the model: loaded with a device map, or hooked by ``cpu_offload``."""
    return getattr(model, "hf_device_map", None) is not None or any(
        hasattr(module, "_hf_hook") for module in model.modules()
    )


@contextmanager
def pipeline_placement(model: torch.nn.Module) -> Iterator[None]:
    """While a pipeline is built around ``model``: a device map whose one entry is where its inputs go.

    The pipeline then takes that device as its own and leaves the weights
    where accelerate put them. The model's own map is restored after.
    """
    if not is_placed(model):
        yield
        return
    missing = object()
    original = model.__dict__.get("hf_device_map", missing)
    model.hf_device_map = {"": input_device(model)}
    try:
        yield
    finally:
        if original is missing:
            del model.hf_device_map
        else:
            model.hf_device_map = original


def check_device_map(model: torch.nn.Module, device_map: object) -> None:
    """Refuse a device map accelerate cannot load, before any weight loads, saying how to fix it.

    ``model`` is the model's structure (meta weights do). A checkpoint that
    ties its output head to its input embedding shares one weight between
    them, and accelerate fails to load it (``weight is on the meta device``)
    when the map offloads one of the two to disk and not the other.

    Raises:
        ValueError: the map splits tied weights across disk and a device.
    """
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if not isinstance(device_map, dict) or head is None or head.weight is not embedding.weight:
        return
    paths = {id(child): path for path, child in model.named_modules()}
    placed = {
        name: device_of(device_map, paths[id(module)]) for name, module in (("head", head), ("embedding", embedding))
    }
    if placed["head"] != placed["embedding"] and "disk" in placed.values():
        raise ValueError(
            f"the device map puts the input embedding ({paths[id(embedding)]!r} on {placed['embedding']!r}) and the "
            f"output head ({paths[id(head)]!r} on {placed['head']!r}), which this checkpoint ties to it, in different "
            f"places, one of them disk, which accelerate cannot load; give both the same entry in the device map"
        )


def device_of(device_map: dict, path: str) -> object:
    """Where a device map puts the module at ``path``: the entry of its longest prefix."""
    for prefix in ancestors(path):
        if prefix in device_map:
            return device_map[prefix]
    return None


def ancestors(path: str) -> list[str]:
    """A module's path and its ancestors' paths, nearest first, down to the root's ``""``."""
    parts = path.split(".") if path else []
    return [".".join(parts[:depth]) for depth in range(len(parts), -1, -1)]
