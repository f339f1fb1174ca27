"""Core's own tests need a family without any plugin: OLMo-1's blocks under core's Layer and Mlp, registered directly."""

import sys
import types

import pytest
from transformers.models.olmo import modeling_olmo

import nnterp
from nnterp import EProperty, Layer, Mlp, Standard
from nnterp.layouts import Residual
from nnterp.testing import tiny_standardized

olmo = types.ModuleType("nnterp_core_tests.families.olmo")
olmo.MODEL_TYPES = ("olmo",)
olmo.MODELING = modeling_olmo


class Contribution(Standard):
    """An attention known only by what it adds to the stream: core has no Attention, its plugin does."""

    @EProperty("output")
    def attention_output(self, value) -> Residual:
        """What the attention adds to the residual stream."""
        return value


olmo.ENVOYS = {
    modeling_olmo.OlmoDecoderLayer: Layer,
    modeling_olmo.OlmoAttention: Contribution,
    modeling_olmo.OlmoMLP: Mlp,
}
olmo.RENAME = {}
olmo.TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
)
sys.modules[olmo.__name__] = olmo


class CoreTestPlugin:
    @nnterp.hookimpl
    def nnterp_families(self):
        return [olmo]


@pytest.fixture(scope="session", autouse=True)
def core_plugin():
    name = nnterp.REGISTRY.register(CoreTestPlugin(), name="core-tests")
    yield olmo
    nnterp.REGISTRY.unregister(name)


@pytest.fixture
def without_core_plugin(core_plugin):
    """Take the core test plugin out for one test (to register a rival for its model type), then put it back."""
    nnterp.REGISTRY.unregister("core-tests")
    yield
    nnterp.REGISTRY.register(CoreTestPlugin(), name="core-tests")


@pytest.fixture(scope="session")
def model(core_plugin):
    return tiny_standardized("olmo")
