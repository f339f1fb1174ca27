"""The generic family: model types no plugin names, served from the layout read off their blocks' forward."""

import io

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

import nnterp
from nnterp import PARALLEL, POST_NORM_ATTENTION, POST_NORM_MLP, StandardizedTransformer, UnknownModelType, Unrecognized
from nnterp.census import coverage, tiny_config_of
from nnterp.testing import PROMPT, AttentionSuite, LayerSuite, close, local_tokenizer, save_tiny
from nnterp_attention.block_layout import BlockLayout, read_layout
from nnterp_attention.generic import attention_envoy, generic_family


def generic(model_type):
    family = generic_family(tiny_config_of(model_type))
    assert not isinstance(family, Unrecognized), f"{model_type}: {family}"
    return family


# -- the layouts, read off the forward of blocks written here -------------------------


class Norm(nn.LayerNorm):
    pass


class Mixer(nn.Linear):
    def forward(self, hidden_states, **kwargs):
        return super().forward(hidden_states), None


class PreNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_a, self.attn, self.ln_b, self.ff = Norm(4), Mixer(4, 4), Norm(4), nn.Linear(4, 4)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        residual = hidden_states
        hidden_states, weights = self.attn(hidden_states=self.ln_a(hidden_states))
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.ff(self.ln_b(hidden_states))
        hidden_states = residual + hidden_states
        outputs = (hidden_states,)
        if output_attentions:
            outputs += (weights,)
        return outputs


class Switchable(nn.Module):
    """Parallel or sequential by an attribute, as GPT-NeoX is by its config."""

    def __init__(self, parallel):
        super().__init__()
        self.parallel = parallel
        self.ln_a, self.attn, self.ln_b, self.ff = Norm(4), Mixer(4, 4), Norm(4), nn.Linear(4, 4)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        attended = self.dropout(self.attn(self.ln_a(x))[0])
        if self.parallel:
            return x + attended + self.ff(self.ln_b(x))
        x = x + attended
        return x + self.ff(self.ln_b(x))


class Chosen(nn.Module):
    """An MLP call chosen by an attribute in one expression, as Moshi chooses its flexible linear."""

    def __init__(self, flexible):
        super().__init__()
        self.flexible = flexible
        self.ln_a, self.attn, self.ln_b, self.ff = Norm(4), Mixer(4, 4), Norm(4), nn.Linear(4, 4)

    def forward(self, x, codebook=None):
        x = x + self.attn(self.ln_a(x))[0]
        return x + (self.ff(self.ln_b(x)) if not self.flexible else self.ff(x))

    def undecided(self, x, codebook):
        x = x + self.attn(self.ln_a(x))[0]
        return x + (self.ff(self.ln_b(x)) if codebook is None else self.ff(x))


class Sandwich(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre_a, self.attn, self.post_a = Norm(4), Mixer(4, 4), Norm(4)
        self.pre_b, self.ff, self.post_b = Norm(4), nn.Linear(4, 4), Norm(4)

    def forward(self, x):
        x = x + self.post_a(self.attn(self.pre_a(x))[0])
        return x + self.post_b(self.ff(self.pre_b(x)))


class Scaled(nn.Module):
    """Each contribution times a number the block holds (Granite's residual multiplier), or a learned gate."""

    def __init__(self, scale):
        super().__init__()
        self.ln_a, self.attn, self.ln_b, self.ff = Norm(4), Mixer(4, 4), Norm(4), nn.Linear(4, 4)
        self.scale = scale

    def forward(self, x):
        x = x + self.attn(self.ln_a(x))[0] * self.scale
        return x + self.ff(self.ln_b(x)) * self.scale


class Reshaped(nn.Module):
    """An MLP over flattened tokens (Llama-4's experts), its output put back in the stream's shape or left flat."""

    def __init__(self, restore):
        super().__init__()
        self.restore = restore
        self.ln_a, self.attn, self.ln_b = Norm(4), Mixer(4, 4), Norm(4)
        self.ff = nn.Sequential(nn.Linear(4, 4), nn.Flatten(0, 1))

    def forward(self, x):
        x = x + self.attn(self.ln_a(x))[0]
        if self.restore:
            return x + self.ff(self.ln_b(x)).view(x.shape)
        return x + self.ff(self.ln_b(x)).reshape(-1, 4)


def test_a_reshape_back_to_the_streams_shape_is_the_same_value_and_a_flattening_is_not():
    assert read_layout(Reshaped(restore=True)).mlp == "ff"
    with pytest.raises(Unrecognized, match=r"reshape\(-1, 4\)"):
        read_layout(Reshaped(restore=False))


def test_a_pre_norm_block_is_read_with_its_norms_and_sublayers():
    assert read_layout(PreNorm()) == BlockLayout("attn", "ff", "ln_a", "ln_b", None, None, parallel=False, returned=1)


def test_a_condition_on_the_module_is_decided_against_it():
    assert read_layout(Switchable(parallel=True)).parallel
    assert not read_layout(Switchable(parallel=False)).parallel


def test_a_value_chosen_by_a_condition_on_the_module_is_read_on_the_side_it_takes(monkeypatch):
    assert read_layout(Chosen(flexible=False)).mlp_norm == "ln_b"
    assert read_layout(Chosen(flexible=True)).mlp_norm is None
    monkeypatch.setattr(Chosen, "forward", Chosen.undecided)
    with pytest.raises(Unrecognized, match=r"a condition it cannot decide: codebook is None"):
        read_layout(Chosen(flexible=False))


def test_norms_after_the_sublayers_are_told_from_the_norms_before():
    assert read_layout(Sandwich()) == BlockLayout("attn", "ff", "pre_a", "pre_b", "post_a", "post_b", parallel=False)


def test_a_contribution_scaled_by_a_number_the_block_holds_is_read_with_its_scale():
    layout = read_layout(Scaled(0.5))
    assert (layout.attention_scale, layout.mlp_scale) == ("scale", "scale")


def test_a_contribution_scaled_by_a_learned_gate_is_not_recognized_and_the_reason_shows_the_expression():
    with pytest.raises(Unrecognized, match=r"self\.attn\(self\.ln_a\(x\)\)\[0\] \* self\.scale"):
        read_layout(Scaled(nn.Parameter(torch.tensor(0.5))))


# -- generic families of real model types, through the suites --------------------------


class TestGenericSequential(LayerSuite, AttentionSuite):
    """StarCoder2: a pre-norm block with LayerNorms, on the shared attention interface."""

    family = generic("starcoder2")


class TestGenericParallel(LayerSuite, AttentionSuite):
    """CodeGen: a parallel block whose one norm feeds both sublayers."""

    family = generic("codegen")


class TestGenericSandwich(LayerSuite, AttentionSuite):
    """AFMoE: a norm before and after each sublayer, in its own spellings, and a mixture of experts."""

    family = generic("afmoe")


class TestGenericPostNorm(LayerSuite, AttentionSuite):
    """FlexOlmo: the sublayers read the stream itself and normalize their outputs before adding them."""

    family = generic("flex_olmo")


class TestGenericSequentialMlp(LayerSuite, AttentionSuite):
    """CTRL: a pre-norm block whose MLP is a torch Sequential, with no act_fn or down_proj to read neurons at."""

    family = generic("ctrl")


class TestGenericAttentionSink(LayerSuite, AttentionSuite):
    """GraniteSWA: its eager attention scales each head's output by a learned sink, so the interior is left to a family."""

    family = generic("granite_swa")


def test_an_eager_function_with_a_sink_leaves_the_interior_out_with_the_reason():
    model = TestGenericAttentionSink.build_model()
    (reason,) = set(model.support()["self_attn.attention_probabilities"].values())
    assert "modeling_granite_swa.eager_attention_forward" in reason and "sink" in reason
    assert model.support()["self_attn.attention_output"] is None


class TestGenericScaled(LayerSuite, AttentionSuite):
    """MiniCPM3: each contribution is the sublayer's output times the block's residual_scale."""

    family = generic("minicpm3")
    load = {"scale_depth": 0.7}  # residual_scale is scale_depth / sqrt(layers): 0.49, not the default's near 1


def test_a_scaled_contribution_is_written_back_divided_by_its_scale():
    model = TestGenericScaled.build_model()
    with model.trace(PROMPT):
        layer = model.layers[0]
        entering = layer.layer_input.save()
        layer.self_attn.attention_output = torch.ones_like(layer.self_attn.attention_output)
        mid = layer.layer_mid.save()
    close(mid, entering + 1, what="layer_mid after assigning ones to the scaled attention_output")


class TestGenericUnpackedMlp(LayerSuite, AttentionSuite):
    """XGLM: a BART-style pre-norm block whose MLP is its own fc1, activation_fn and fc2, as a decoder-only model."""

    family = generic("xglm")


def test_an_unpacked_mlp_serves_its_neurons_and_output_at_its_projections():
    model = TestGenericUnpackedMlp.build_model()
    mlp = model.layers[0].mlp
    with model.trace(PROMPT):
        normed = model.layers[0].mlp_norm_output.save()
        entering = model.layers[0].mlp_input.save()
        activation = mlp.mlp_activation.save()
        neurons = mlp.mlp_neurons.save()
        output = mlp.mlp_output.save()
    projection = mlp._module
    assert neurons.shape[-1] == mlp.intermediate_size == projection.in_features
    close(neurons, activation, what="the activation's output is the neurons (no dropout in eval)")
    close(torch.nn.functional.linear(neurons, projection.weight, projection.bias), output, what="fc2(neurons)")
    close(entering, normed, what="the MLP is called with its pre-norm's output")


class TestGenericPostNormStream(LayerSuite, AttentionSuite):
    """BART's decoder: a post-norm block, norm2(norm1(x + attn(x)) + mlp(norm1(...))), whose identity runs through its norms."""

    family = generic("bart")


def test_a_post_norm_block_names_the_norms_after_each_addition():
    model = TestGenericPostNormStream.build_model()
    assert model.layers[0].stream_norms() == ("self_attn_layer_norm", "final_layer_norm")
    assert model.support()["mlp_norm_output"] == dict.fromkeys(range(model.num_layers), POST_NORM_MLP)
    with model.trace(PROMPT):
        mid = model.layers[0].layer_mid.save()
        entering = model.layers[0].mlp_input.save()
    close(mid, entering, what="the MLP reads the stream between the sublayers, the first norm's output")


def test_a_parallel_block_has_no_stream_between_its_sublayers():
    model = TestGenericParallel.build_model()
    assert model.support()["layer_mid"] == dict.fromkeys(range(model.num_layers), PARALLEL)
    assert model.support()["mlp_norm_output"] is None


def test_a_post_norm_block_has_no_pre_norm_outputs():
    model = TestGenericPostNorm.build_model()
    assert model.support()["attention_norm_output"] == dict.fromkeys(range(model.num_layers), POST_NORM_ATTENTION)


def test_an_attention_off_the_shared_interface_says_its_interior_is_out_of_reach():
    class Projected(Mixer):
        def __init__(self):
            super().__init__(4, 4)
            self.o_proj = nn.Linear(4, 4)

    layout = read_layout(PreNorm())
    assert "Projected.forward does not call" in attention_envoy([Projected()], layout).off_interface(None)
    assert "no output projection" in attention_envoy([Mixer(4, 4)], layout).off_interface(None)
    model = TestGenericUnpackedMlp.build_model()
    (reason,) = set(model.support()["self_attn.attention_probabilities"].values())
    assert "XGLMAttention.forward does not call" in reason


def test_an_mlp_without_the_standard_children_says_its_neurons_are_out_of_reach():
    model = TestGenericSequentialMlp.build_model()
    (reason,) = set(model.support()["mlp.mlp_neurons"].values())
    assert "(Sequential)" in reason and "down_proj" in reason and "RENAME" in reason
    assert model.support()["mlp.mlp_output"] is None
    with pytest.raises(nnterp.Unavailable, match="no down_proj module"):
        with model.trace("Hello"):
            model.layers[0].mlp.mlp_neurons.save()


def test_a_saved_model_of_an_unnamed_type_loads_by_path_as_generic(tmp_path):
    save_tiny(generic("codegen"), tmp_path)
    model = StandardizedTransformer(tmp_path)
    assert model.family is generic("codegen")
    assert model.generic.startswith("parallel block")
    assert repr(model).startswith(f"StandardizedTransformer (generic family of 'codegen': {model.generic})")
    assert model.support().generic == model.generic
    assert "generic family" in repr(model.support())


def test_a_checkpoint_whose_causal_lm_is_its_text_model_loads_by_path_as_generic(tmp_path):
    """Dots3-Note's causal LM is built from its text config; a released checkpoint states the multimodal type."""
    pytest.importorskip("transformers.models.dots3_note", reason="Dots3-Note is in transformers 5.24 on")
    config = tiny_config_of("dots3_note")
    model = AutoModelForCausalLM.from_config(config)
    assert model.config.model_type == "dots3_note_text"
    model.save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    local_tokenizer(config.get_text_config().vocab_size).save_pretrained(tmp_path)
    loaded = StandardizedTransformer(tmp_path)
    assert loaded.family is generic("dots3_note") and loaded.generic.startswith("sequential block")
    with loaded.trace(PROMPT):
        entering = loaded.layers[0].layer_input.save()
        attention = loaded.layers[0].self_attn.attention_output.save()
        mlp = loaded.layers[0].mlp.mlp_output.save()
        leaving = loaded.layers[0].layer_output.save()
    close(entering + attention + mlp, leaving, what="layer_input + attention + mlp")


def test_a_causal_lm_configured_by_a_text_config_the_mapping_does_not_name_is_refused_saying_so():
    reason = generic_family(tiny_config_of("emu3"))
    assert isinstance(reason, Unrecognized) and "'emu3_text_model', which transformers' causal-LM" in str(reason)


def test_a_named_family_is_not_marked_generic():
    model = nnterp.testing.tiny_standardized("llama")
    assert model.generic is None
    assert repr(model).startswith("StandardizedTransformer (family llama)")


def test_an_unrecognized_type_raises_before_loading_naming_what_it_found_and_the_fix(tmp_path):
    save_tiny(_xlm_family(), tmp_path)
    with pytest.raises(UnknownModelType, match=r"'xlm'.*out_lin.*Write a family") as raised:
        StandardizedTransformer(tmp_path)
    assert raised.value.reasons and raised.value.distribution is None


def _xlm_family():
    """XLM runs its blocks inline in its model's forward, over parallel lists of attentions, norms and MLPs: the
    first list as long as its blocks is its attentions, which no generic layout reads as a block."""
    import types

    family = types.ModuleType("xlm_for_the_test")
    family.MODEL_TYPES = ("xlm",)
    family.TINY_CONFIG = dict(vocab_size=64, emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=64)
    family.ENVOYS, family.RENAME = {}, {}  # only its tiny model is built
    return family


def test_the_census_marks_generic_and_unserved_types_with_their_reasons():
    rows = {row.model_type: row for row in coverage()}
    assert rows["codegen"].generic == generic("codegen").GENERIC and rows["codegen"].plugin == "attention"
    # Cohere scales its logits after the head; logits are read where the model returns them, so it is served
    assert rows["cohere"].generic.startswith("parallel block")
    assert rows["llama"].family == "llama" and rows["llama"].generic is None
    assert rows["bert"].family == "bert" and rows["bert"].generic is None
    assert not rows["xlm"].served and "out_lin" in rows["xlm"].reason


def test_the_plugins_command_says_which_plugin_builds_generic_families():
    import io

    from nnterp import cli

    out = io.StringIO()
    assert cli.plugins(out) == 0
    assert "attention also serves, with a generic family, a model type no family names" in out.getvalue()


def test_a_model_with_a_conv_block_is_refused_though_its_attention_blocks_alone_are_recognized():
    """LFM2's tiny config builds its conv blocks too, so the generic family no longer claims the whole model."""
    import copy

    config = tiny_config_of("lfm2")
    refused = generic_family(config)
    assert isinstance(refused, Unrecognized) and "Lfm2ShortConv" in str(refused)
    attention_only = copy.deepcopy(config)
    attention_only.layer_types = ["full_attention"] * config.num_hidden_layers
    assert not isinstance(generic_family(attention_only), Unrecognized)


def test_the_census_says_which_kinds_of_a_partly_served_type_are_served(monkeypatch):
    """With no family naming LFM2, its attention layers are served and its conv layers are not: partly served."""
    from nnterp import census, cli

    real_family_for = nnterp.REGISTRY.family_for

    def unnamed(model_type, config=None):
        if model_type == "lfm2":
            family = generic_family(config)
            if isinstance(family, Unrecognized):
                raise UnknownModelType("no family names lfm2", reasons=(str(family),))
            return family
        return real_family_for(model_type, config)

    monkeypatch.setattr(nnterp.REGISTRY, "family_for", unnamed)
    assert census.served_kinds("lfm2") == ("full_attention",)
    monkeypatch.setattr(census, "causal_lm_types", lambda: ["lfm2"])
    out = io.StringIO()
    assert cli.coverage(out, as_json=False, run_checks=None) == 0
    line = out.getvalue().splitlines()[0]
    assert "partly served: its full_attention layers are" in line and "Lfm2ShortConv" in line
