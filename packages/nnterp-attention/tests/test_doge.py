"""Doge: a residual scaled per channel before each addition, and scores biased by a learned per-key mask."""

import pytest
import torch

from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT, LayerSuite, close, family_suite
from nnterp_attention.families.doge import MOE_BROKEN, MOE_RUNS, PRODUCT_KEY_EXPERTS, RESIDUAL_SCALES
from nnterp_attention.testing import AlibiAttentionSuite


class ScaledResidual:
    """The identities of Doge's block, with its residual scales and mask bias moved off their initial values."""

    @classmethod
    def build_model(cls):
        model = super().build_model()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for layer in model._module.model.layers:
                for name in RESIDUAL_SCALES:
                    getattr(layer, name).copy_(torch.rand(layer.input_residual.shape, generator=generator) + 0.5)
                layer.self_attn.A.copy_(torch.randn(layer.self_attn.A.shape, generator=generator))
        return model

    @classmethod
    def load_saved(cls, directory: str) -> StandardizedTransformer:
        """Loaded under eager, as the suites build it: before 5.25 Doge's sdpa path computes other logits than eager."""
        return StandardizedTransformer(directory, attn_implementation="eager", **cls.load)

    def test_the_plain_sum_does_not_hold_under_scaled_residuals(self) -> None:
        layer = self.model.layers[0]
        parts: list[torch.Tensor] = []  # bound outside: a name first bound inside a trace does not survive it
        with self.model.trace(PROMPT):
            entering = layer.layer_input.save()
            parts.extend((layer.self_attn.attention_output.save(), layer.mlp.mlp_output.save()))
            leaving = layer.layer_output.save()
        assert not torch.allclose(entering + sum(parts), leaving, atol=1e-3), "the residual scales had no effect"
        scaled = entering
        for name, part in zip(RESIDUAL_SCALES, parts, strict=True):
            scaled = getattr(layer._module, name).detach() * scaled + part
        close(scaled, leaving, what="the scaled sums, by hand, vs layer_output")


class TestDoge(ScaledResidual, family_suite("doge", AlibiAttentionSuite)):
    def test_scores_carry_the_bias_of_the_values(self) -> None:
        """Scores are the scaled product of queries and keys plus exp(A * softplus(dt_proj(values))), per key."""
        attention = self.model.layers[0].self_attn
        module = attention._module
        with self.model.trace(PROMPT):
            queries = attention.attention_queries.save()
            keys = attention.attention_keys.save()
            values = attention.attention_values.save()
            scores = attention.attention_scores.save()
        groups = attention.num_heads // attention.num_kv_heads
        with torch.no_grad():
            product = queries @ keys.repeat_interleave(groups, 1).transpose(-1, -2) * module.scaling
            dt = module.dt_proj(values.transpose(1, 2).flatten(-2))
            bias = torch.exp(module.A * torch.nn.functional.softplus(dt)).transpose(-1, -2)
        expected = product + bias.repeat_interleave(groups, 1)[:, :, None, :]
        seen = torch.tril(torch.ones(scores.shape[-2:], dtype=torch.bool))
        close(scores[..., seen], expected[..., seen], atol=1e-4, what="scores vs q.k * scaling + the values' bias")


@pytest.mark.skipif(not MOE_RUNS, reason=MOE_BROKEN)
class TestDogeMoe(ScaledResidual, LayerSuite):
    family = "doge"
    load = {"is_moe": True}

    def test_product_key_experts_serve_their_sum_alone(self) -> None:
        support = self.model.support()
        every = {layer: PRODUCT_KEY_EXPERTS for layer in range(self.model.num_layers)}
        assert support["mlp.mlp_neurons"] == every
        assert support["mlp.mlp_activation"] == every
