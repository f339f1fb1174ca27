import pytest
import torch

from nnterp import Unavailable
from nnterp.testing import PROMPT, LayerSuite, close, family_suite, tiny_standardized
from nnterp_attention import NOT_EAGER
from nnterp_attention.families.gpt2 import REORDERED

INTERFACE_VALUES = (
    "attention_queries",
    "attention_keys",
    "attention_values",
    "attention_scores",
    "attention_probabilities",
    "attention_head_outputs",
)


class TestGPT2(family_suite("gpt2")):
    def test_norms_and_conv1d_mlp_under_standard_names(self) -> None:
        layer = self.model.layers[0]
        ln_1 = layer.input_layernorm._module
        with self.model.trace(PROMPT):
            entering = layer.layer_input.save()
            normed = layer.attention_norm_output.save()
            mlp_normed = layer.mlp_norm_output.save()
            mlp_input = layer.mlp_input.save()
            activation = layer.mlp.mlp_activation.save()
            neurons = layer.mlp.mlp_neurons.save()
        expected = torch.nn.functional.layer_norm(entering, ln_1.normalized_shape, ln_1.weight, ln_1.bias, ln_1.eps)
        close(normed, expected, what="attention_norm_output vs ln_1(layer_input)")
        close(mlp_input, mlp_normed, what="mlp_input vs mlp_norm_output (ln_2's output)")
        assert layer.mlp.intermediate_size == self.model._module.config.n_inner
        assert neurons.shape[-1] == layer.mlp.intermediate_size, "c_proj's input is not intermediate_size wide"
        close(neurons, activation, what="a plain MLP's neurons are its activation")

    def test_queries_refuse_in_place_edits_and_take_assignment(self) -> None:
        attention = self.model.layers[0].self_attn
        with pytest.raises(RuntimeError, match="modified inplace"):
            with self.model.trace(PROMPT):
                attention.attention_queries[:] = 0
        with self.model.trace(PROMPT):
            attention.attention_queries = torch.zeros_like(attention.attention_queries)
            pattern = attention.attention_probabilities.save()
        seq = pattern.shape[-1]
        uniform = torch.full_like(pattern[0, :, -1], 1 / seq)
        close(pattern[0, :, -1], uniform, what="last query's pattern under zero queries")

    def test_head_outputs_take_in_place_edits(self) -> None:
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            clean = attention.attention_output.save()
        with self.model.trace(PROMPT):
            attention.attention_head_outputs[:, -1] = 0
            edited = attention.attention_output.save()
        close(edited[:, :-1], clean[:, :-1], what="outputs before the edited position")
        assert not torch.allclose(edited[:, -1], clean[:, -1]), "zeroing the last head outputs changed nothing"
        close(edited[0, -1], attention.c_proj._module.bias, what="the edited position's output is c_proj's bias alone")


class TestGPT2Reordered(LayerSuite):
    """reorder_and_upcast_attn: the eager path runs GPT-2's own attention, not the interface."""

    family = "gpt2"
    load = {"reorder_and_upcast_attn": True}

    def test_interface_values_report_the_reordered_path(self) -> None:
        support = self.model.support()
        everywhere = {layer: REORDERED for layer in range(self.model.num_layers)}
        for name in INTERFACE_VALUES:
            assert support[f"self_attn.{name}"] == everywhere, name
        assert support["self_attn.attention_output"] is None
        with pytest.raises(Unavailable, match="reorder_and_upcast_attn"):
            with self.model.trace(PROMPT):
                self.model.layers[0].self_attn.attention_probabilities.save()

    def test_another_implementation_is_the_reason_it_gives(self) -> None:
        model = tiny_standardized(self.family, attn_implementation="sdpa", **self.load)
        reason = NOT_EAGER.format(implementation="sdpa")
        assert model.support(layer=0)["self_attn.attention_probabilities"] == reason
