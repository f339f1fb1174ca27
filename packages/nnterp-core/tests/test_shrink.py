"""The tiny configs the census and the generic families read a model type's layout from."""

import pytest
from transformers import AutoConfig

from nnterp.testing.models import TOKEN_IDS
from nnterp.testing.shrink import layer_kinds, tiny_overrides


def built(model_type):
    return AutoConfig.for_model(model_type, **{**TOKEN_IDS, **tiny_overrides(model_type)})


def test_a_kind_the_config_assigns_but_its_default_does_not_list_is_built():
    """LFM2's default config lists attention layers only; its config makes every layer not in full_attn_idxs a conv."""
    assert set(AutoConfig.for_model("lfm2").layer_types) == {"full_attention"}
    config = built("lfm2")
    assert sorted(config.layer_types) == ["conv", "full_attention"]
    assert config.num_hidden_layers == len(config.layer_types)


@pytest.mark.parametrize("model_type", ["qwen3_next", "kimi_linear", "gemma2", "nemotron_h"])
def test_every_kind_of_layer_the_default_lists_is_in_the_tiny_model(model_type):
    default = AutoConfig.for_model(model_type).get_text_config().to_dict()
    config = built(model_type).get_text_config().to_dict()
    for name in ("layer_types", "mlp_layer_types", "layers_block_type"):
        if isinstance(default.get(name), list):
            assert set(config[name]) == set(default[name]), name
            assert len(config[name]) <= max(len(set(default[name])), 2)


def test_the_kinds_of_one_list_are_not_taken_from_another():
    """Kimi's config names its MLP kinds ("dense", "sparse") too; they are not kinds of its layer_types."""
    config = AutoConfig.for_model("kimi_linear")
    assert set(layer_kinds(config, "layer_types")) == {"full_attention", "linear_attention"}
    assert set(layer_kinds(config, "mlp_layer_types")) == {"dense", "sparse"}


def test_a_sliding_kind_is_not_assigned_to_a_config_without_a_window():
    """GOT-OCR2's configuration names sliding layers, which only a window makes; its default has none."""
    assert AutoConfig.for_model("got_ocr2").get_text_config().sliding_window is None
    assert "sliding_attention" not in built("got_ocr2").get_text_config().layer_types
