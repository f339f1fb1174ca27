"""The tiny configs the census and the generic families read a model type's layout from."""

import pytest
from transformers import AutoConfig

from nnterp.testing.models import TOKEN_IDS
from nnterp.testing.shrink import TINY_SIZES, _per_layer_settings, layer_kinds, tiny_overrides


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


def test_a_list_with_an_entry_per_layer_is_as_long_as_the_tiny_model():
    """Gemma-3n sets an activation sparsity per layer, which its config checks against its depth."""
    default = AutoConfig.for_model("gemma3n").get_text_config()
    assert len(default.activation_sparsity_pattern) == default.num_hidden_layers > 2
    config = built("gemma3n").get_text_config()
    assert len(config.activation_sparsity_pattern) == config.num_hidden_layers


def test_each_tiny_layer_takes_the_per_layer_settings_of_the_first_default_layer_of_its_kind():
    saved = {
        "layer_types": ["local", "local", "global", "local"],
        "scale": [1.0, 2.0, 3.0, 4.0],
        "per_layer_config": {"02": {"head_dim": 512}},
    }
    overrides = {"layer_types": ["local", "global"]}
    fields = {standard: standard for standard in TINY_SIZES}
    settings = _per_layer_settings(saved, overrides, {"layer_types": ["local", "global"]}, 2, 4, fields)
    assert settings == {"scale": [1.0, 3.0], "per_layer_config": {1: {"head_dim": TINY_SIZES["head_dim"]}}}


def test_overrides_keyed_by_layer_index_follow_their_layers_kind_and_are_shrunk():
    """Gemma-4 widens the heads of its full-attention layers (per_layer_config, keyed "05", "11", ...)."""
    default = AutoConfig.for_model("gemma4").get_text_config().to_dict()
    assert {entry["head_dim"] for entry in default["per_layer_config"].values()} == {512}
    text = tiny_overrides("gemma4")["text_config"]
    full = [index for index, kind in enumerate(text["layer_types"]) if kind == "full_attention"]
    assert full and text["per_layer_config"] == {index: {"head_dim": 16} for index in full}
    built("gemma4")


def test_a_mixture_keeps_a_smaller_top_k_and_gets_experts_where_its_default_leaves_them_unset():
    assert AutoConfig.for_model("zaya").num_experts_per_tok == 1
    assert built("zaya").num_experts_per_tok == 1  # ZAYA allows one expert per token only
    assert AutoConfig.for_model("dots1").n_routed_experts is None
    dots1 = built("dots1")
    assert (dots1.n_routed_experts, dots1.num_experts_per_tok, dots1.n_shared_experts) == (4, 2, 1)


def test_sizes_the_default_keeps_consistent_stay_so():
    """Dots3-Note's sliding layers' head is their unrotated part plus the rotated one, which its config checks, and its
    adapters are as wide as the text model."""
    pytest.importorskip("transformers.models.dots3_note", reason="Dots3-Note is in transformers 5.24 on")
    default = AutoConfig.for_model("dots3_note").get_text_config()
    sliding = default.to_dict()["per_layer_config"]["02"]
    assert default.head_dim == sliding["qk_nope_head_dim"] + default.qk_rope_head_dim
    config = built("dots3_note")
    text = config.get_text_config()
    assert text.head_dim == TINY_SIZES["qk_nope_head_dim"] + text.qk_rope_head_dim
    assert config.vision_config.adapter_out_dim == config.audio_config.adapter_out_dim == text.hidden_size


def test_a_kind_of_layer_without_rotary_parameters_gets_the_default_ones():
    """Cohere-Compass's rotary embedding reads rope_parameters[layer_type], which its default config leaves empty."""
    pytest.importorskip("transformers.models.cohere_compass", reason="Cohere-Compass is not in this transformers")
    assert not AutoConfig.for_model("cohere_compass_text").to_dict()["rope_parameters"]
    config = built("cohere_compass_text")
    assert set(config.layer_types) <= set(config.rope_parameters)
    assert AutoConfig.for_model("llama").rope_parameters == built("llama").rope_parameters
