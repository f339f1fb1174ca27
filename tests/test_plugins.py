"""The official plugins, installed from their distributions, honour the plugin contract together."""

import importlib
import importlib.metadata
import pathlib

import pytest

import nnterp
from nnterp.registry import MODEL_TYPES_GROUP, OFFICIAL_PLUGINS, family_name
from nnterp.testing import tiny_config

ROOT = pathlib.Path(__file__).parents[1]
OFFICIAL = frozenset(OFFICIAL_PLUGINS)


def official_plugins():
    return [info for info in nnterp.REGISTRY.plugins() if info.distribution in OFFICIAL]


def test_every_installed_official_plugin_loads():
    installed = {ep.dist.name for ep in importlib.metadata.entry_points(group="nnterp") if ep.dist}
    failed = [failure for failure in nnterp.REGISTRY.failures if failure.distribution in OFFICIAL]
    assert not failed, failed
    assert {info.distribution for info in official_plugins()} == installed & set(OFFICIAL)


@pytest.mark.parametrize("info", official_plugins(), ids=lambda info: info.name)
def test_families_follow_the_contract(info):
    assert info.families, f"{info.name} provides no family"
    for family in info.families:
        for attribute in ("MODEL_TYPES", "ENVOYS", "RENAME", "TINY_CONFIG"):
            assert hasattr(family, attribute), f"{family.__name__} has no {attribute}"
        assert getattr(nnterp.families, family_name(family)) is family
        assert tiny_config(family).model_type == family.MODEL_TYPES[0]


def test_official_plugins_are_the_packages_of_this_repository():
    packages = {path.name for path in (ROOT / "packages").iterdir() if (path / "pyproject.toml").exists()}
    assert OFFICIAL == packages - {"nnterp-core"}


@pytest.mark.parametrize("info", official_plugins(), ids=lambda info: info.name)
def test_each_plugin_declares_in_its_metadata_the_model_types_its_families_serve(info):
    """The metadata a broken plugin is named from (``nnterp.model_types``) is what its families declare: each type with
    its family's module; an entry whose family is not provided is one of a model this transformers lacks."""
    declared = {
        entry_point.name: entry_point.value
        for entry_point in importlib.metadata.entry_points(group=MODEL_TYPES_GROUP)
        if entry_point.dist and entry_point.dist.name == info.distribution
    }
    served = {model_type: family.__name__ for family in info.families for model_type in family.MODEL_TYPES}
    assert {model_type: declared.get(model_type) for model_type in served} == served, (
        f'declare each model type in {info.distribution}\'s pyproject.toml, [project.entry-points."nnterp.model_types"]'
    )
    for model_type in declared.keys() - served.keys():
        with pytest.raises(ModuleNotFoundError, match="transformers.models"):
            importlib.import_module(declared[model_type])
