import warnings

import pytest
import torch
from nnsight import NNsightDeprecationWarning

from nnterp import Layer, Mlp, StandardizedTransformer
from nnterp.testing import PROMPT, close, local_tokenizer, save_tiny, tiny_model


def test_standard_names_sizes_and_family(model, core_plugin):
    assert model.family is core_plugin
    assert isinstance(model.layers[0], Layer) and isinstance(model.layers[1].mlp, Mlp)
    assert (model.hidden_size, model.num_layers, model.vocab_size) == (32, 2, 64)
    assert (model.num_heads, model.num_kv_heads, model.head_dim, model.intermediate_size) == (2, 2, 16, 64)
    assert model.layers[0].mlp.intermediate_size == 64
    assert model.embed_tokens._module is model._module.model.embed_tokens
    assert model.ln_final._module is model._module.model.norm
    assert model.lm_head._module is model._module.lm_head


def test_embeddings_and_final_norm_bracket_the_blocks(model):
    with model.trace(PROMPT):
        embeddings = model.embed_tokens.output.save()
        entering = model.layers[0].layer_input.save()
        leaving = model.layers[-1].layer_output.save()
        normed_input = model.ln_final.input.save()
    close(entering, embeddings, what="layers[0].layer_input vs the embeddings")
    close(normed_input, leaving, what="ln_final's input vs the last layer_output")


def test_a_normal_load_and_trace_emit_no_nnsight_deprecation_warning(core_plugin, tmp_path):
    save_tiny("olmo", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NNsightDeprecationWarning)
        loaded = StandardizedTransformer(str(tmp_path))
        with loaded.trace(PROMPT):
            loaded.logits.save()
        in_memory = StandardizedTransformer(tiny_model("olmo"), tokenizer=local_tokenizer())
        with in_memory.generate(PROMPT, max_new_tokens=2, do_sample=False):
            in_memory.layers[0].layer_output.save()


def test_generate_serves_each_step(model):
    steps = []
    with model.generate(PROMPT, max_new_tokens=3, do_sample=False) as tracer:
        for _ in tracer.iter[:3]:
            steps.append(model.layers[0].layer_output.save())
    assert [tuple(step.shape[:2]) for step in steps] == [(1, len(model.tokenizer(PROMPT).input_ids)), (1, 1), (1, 1)]


def test_support_reports_every_block_value(model):
    support = model.support()
    assert support["layer_output"] is None and support["mlp.mlp_neurons"] is None
    assert model.support(layer=1)["self_attn.attention_output"] is None


def test_support_of_a_layer_out_of_range_names_the_value_and_the_valid_range(model):
    assert model.support(layer=-2) == model.support(layer=0)
    assert model.support(layer=-1) == model.support(layer=1)
    for layer in (2, -3, 17):
        with pytest.raises(IndexError) as raised:
            model.support(layer=layer)
        message = str(raised.value)
        assert f"support(layer={layer})" in message, message
        assert "has 2 layers" in message and "0 to 1" in message and "-2 to -1" in message, message


def test_a_model_that_is_not_a_transformers_model_is_refused():
    with pytest.raises(TypeError, match="has no transformers config"):
        StandardizedTransformer(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="hub id, a local directory or a loaded model"):
        StandardizedTransformer(42)
