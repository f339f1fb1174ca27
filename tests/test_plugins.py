"""The official plugins, installed from their distributions, honour the plugin contract together."""

import importlib.metadata

import pytest
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

import nnterp
from nnterp.registry import KNOWN_DISTRIBUTIONS, family_name
from nnterp.testing import tiny_config

#: The distributions core sends a model type to: every official plugin.
OFFICIAL = frozenset(KNOWN_DISTRIBUTIONS.values())


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
        for model_type in family.MODEL_TYPES:
            assert KNOWN_DISTRIBUTIONS.get(model_type) == info.distribution, (
                f"core's KNOWN_DISTRIBUTIONS does not send {model_type!r} to {info.distribution}"
            )
        assert tiny_config(family).model_type == family.MODEL_TYPES[0]


def test_known_distributions_are_all_provided_when_every_plugin_is_installed():
    if {info.distribution for info in official_plugins()} != set(OFFICIAL):
        pytest.skip("not every official plugin is installed")
    provided = {model_type for info in official_plugins() for f in info.families for model_type in f.MODEL_TYPES}
    # a model of a later transformers release is known, and left out where the installed one lacks it
    known = set(KNOWN_DISTRIBUTIONS) & set(CONFIG_MAPPING_NAMES)
    assert known <= provided, known - provided
