"""A third party's plugin, registered directly: its family passes the same suites as the official ones."""

import sys
import types

import pytest
from transformers.models.starcoder2 import modeling_starcoder2

import nnterp
from nnterp import Layer, Mlp
from nnterp.testing import family_suite, tiny_standardized
from nnterp_attention import Attention

starcoder2 = types.ModuleType("nnterp_starcoder.families.starcoder2")
starcoder2.MODEL_TYPES = ("starcoder2",)
starcoder2.MODELING = modeling_starcoder2
starcoder2.ENVOYS = {
    modeling_starcoder2.Starcoder2DecoderLayer: Layer,
    modeling_starcoder2.Starcoder2Attention: Attention,
    modeling_starcoder2.Starcoder2MLP: Mlp,
}
starcoder2.RENAME = {"mlp.c_proj": "mlp.down_proj", "mlp.act": "mlp.act_fn"}
starcoder2.TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
sys.modules[starcoder2.__name__] = starcoder2


class StarcoderPlugin:
    @nnterp.hookimpl
    def nnterp_families(self):
        return [starcoder2]


@pytest.fixture(scope="module", autouse=True)
def registered():
    name = nnterp.REGISTRY.register(StarcoderPlugin(), name="starcoder")
    yield
    nnterp.REGISTRY.unregister(name)


class TestStarcoder2(family_suite(starcoder2)):
    pass


def test_the_family_is_reachable_by_name_and_listed():
    assert nnterp.families.starcoder2 is starcoder2
    info = next(info for info in nnterp.REGISTRY.plugins() if info.name == "starcoder")
    assert info.families == [starcoder2]


def test_aliased_mlp_names_serve_the_modules_own_spelling():
    model = tiny_standardized("starcoder2")
    with model.trace("Hello"):
        neurons = model.layers[0].mlp.mlp_neurons.save()
        native = model.model.layers[0].mlp.c_proj.input.save()
    assert neurons is native or (neurons == native).all()
