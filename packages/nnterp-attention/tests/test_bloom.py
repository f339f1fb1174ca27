import pytest
import torch
from transformers.models.bloom import modeling_bloom as MODELING

from nnterp import Unavailable
from nnterp.testing import PROMPT, Suite, close, family_suite, tiny_standardized
from nnterp_attention.families.bloom import NORMED_RESIDUAL
from nnterp_attention.testing import causal_softmax


class TestBloom(family_suite("bloom")):
    def test_zero_queries_leave_the_alibi_bias(self) -> None:
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            attention.attention_queries = torch.zeros_like(attention.attention_queries)
            pattern = attention.attention_probabilities.save()
        bias = MODELING.build_alibi_tensor(torch.ones(1, pattern.shape[-1]), attention.num_heads, torch.float32)
        close(pattern, causal_softmax(bias)[None], what="pattern under zero queries vs the ALiBi bias's")

    def test_values_read_after_a_child_modules_output_are_served(self) -> None:
        """The pattern is attention_dropout's output and the neurons down_proj's input; what follows them still comes.

        On a fresh model, whose first trace reads a child's value before the operations after it.
        """
        model = tiny_standardized(self.family)
        layer = model.layers[0]
        with model.trace(PROMPT):
            pattern = layer.self_attn.attention_probabilities.save()
            heads = layer.self_attn.attention_head_outputs.save()
            neurons = layer.mlp.mlp_neurons.save()
            added = layer.mlp.mlp_output.save()
        with model.trace(PROMPT):
            values = layer.self_attn.attention_values.save()
        close(heads, (pattern @ values).transpose(1, 2), what="head outputs read after the pattern")
        down = layer.mlp.down_proj._module
        close(added, torch.nn.functional.linear(neurons, down.weight, down.bias), what="mlp_output after the neurons")

    def test_decode_step_keys_and_values_include_the_cached_ones(self) -> None:
        seq = len(self.model.tokenizer(PROMPT).input_ids)
        attention = self.model.layers[0].self_attn
        saved: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1:2]:
                saved.extend(getattr(attention, name).save() for name in ("attention_keys", "attention_values"))
        assert [tuple(value.shape) for value in saved] == [(1, attention.num_heads, seq + 1, attention.head_dim)] * 2


class TestBloomNormedResidual(Suite):
    """apply_residual_connection_post_layernorm: each sublayer adds its output to its pre-norm's, not to the stream."""

    family = "bloom"
    load = {"apply_residual_connection_post_layernorm": True}

    def test_contributions_report_the_flag(self) -> None:
        everywhere = {layer: NORMED_RESIDUAL for layer in range(self.model.num_layers)}
        support = self.model.support()
        for name in ("layer_mid", "self_attn.attention_output", "mlp.mlp_output"):
            assert support[name] == everywhere, name
        assert support["layer_output"] is None
        assert support["self_attn.attention_probabilities"] is None, "the flag does not touch the attention's interior"
        with pytest.raises(Unavailable, match="apply_residual_connection_post_layernorm"):
            with self.model.trace(PROMPT):
                self.model.layers[0].mlp.mlp_output.save()

    def test_the_reason_points_at_what_each_sublayer_computes(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            normed = layer.attention_norm_output.save()
            attention = layer.self_attn.source.dropout_add_0.input.save()
            between = layer.post_attention_layernorm.input.save()
            mlp_normed = layer.mlp_norm_output.save()
            mlp = layer.mlp.source.dropout_add_0.input.save()
            output = layer.layer_output.save()
        close(normed + attention, between, what="attention_norm_output + the attention's dropout_add input")
        close(mlp_normed + mlp, output, what="mlp_norm_output + the MLP's dropout_add input vs layer_output")
