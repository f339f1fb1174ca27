"""Beam: depth-scaled additions of post-normed sublayers, position-free full attention, an unscaled-router mixture."""

import math

import pytest

pytest.importorskip("transformers.models.beam", reason="Beam arrives in transformers 5.23")

import torch  # noqa: E402

from nnterp.testing import (  # noqa: E402
    PROMPT,
    close,
    draw_selection_bias,
    family_suite,  # noqa: E402
)


def depth_scaled(contribution: torch.Tensor, stream: torch.Tensor, depth: int) -> torch.Tensor:
    """Addition number ``depth`` by its definition: the stream keeps ``sqrt((k - 1) / k)``, the contribution ``1/sqrt(k)``."""
    return stream * math.sqrt((depth - 1) / depth) + contribution / math.sqrt(depth)


class TestBeam(family_suite("beam")):
    @classmethod
    def build_model(cls):
        # A checkpoint's selection bias is learned; the tiny model's zeros would leave the scoring's bias unchecked.
        return draw_selection_bias(super().build_model(), 0.05)

    def test_each_addition_weighs_the_stream_and_the_contribution_by_its_depth(self) -> None:
        """Block i's additions are the model's 2i+2 and 2i+3; the plain sum does not hold."""
        for index, layer in enumerate(self.model.layers):
            with self.model.trace(PROMPT):
                entering = layer.layer_input.save()
                attended = layer.self_attn.attention_output.save()
                mid = layer.layer_mid.save()
                added = layer.mlp.mlp_output.save()
                leaving = layer.layer_output.save()
            assert not torch.allclose(entering + attended + added, leaving, atol=1e-3), "the plain sum holds"
            close(depth_scaled(attended, entering, 2 * index + 2), mid, what=f"layers[{index}].layer_mid")
            close(depth_scaled(added, mid, 2 * index + 3), leaving, what=f"layers[{index}].layer_output")

    def test_full_attention_queries_are_scaled_by_position_and_not_rotated(self) -> None:
        """The full block's queries are its normed projections times (1 + (position + 1) / 2048) ** 0.1."""
        layer = self.model.layers[1]
        assert self.model._module.config.layer_types[1] == "full_attention"
        with self.model.trace(PROMPT):
            normed = layer.attention_norm_output.save()
            queries = layer.self_attn.attention_queries.save()
        module = layer.self_attn._module
        with torch.no_grad():
            projected = module.q_norm(module.q_proj(normed).view(*normed.shape[:2], -1, module.head_dim))
        positions = torch.arange(normed.shape[1], dtype=torch.float32)
        factor = (1 + (positions + 1) / 2048) ** 0.1
        close(queries, projected.transpose(1, 2) * factor[:, None], what="full block's queries vs scaled projections")
        assert (factor[-1] - 1) > 1e-4, "the prompt is too short for the scale to show"

    def test_the_mixture_adds_its_post_normed_experts_sum_times_the_scaling_factor(self) -> None:
        layer = self.model.layers[1]
        with self.model.trace(PROMPT):
            routed = layer.mlp.routed_output.save()
            added = layer.mlp.mlp_output.save()
        block = layer._module
        scale = self.model._module.config.routed_scaling_factor
        assert scale != 1
        with torch.no_grad():
            expected = block.post_feedforward_layernorm(routed * scale)
        close(added, expected, what="mlp_output vs post_feedforward_layernorm(routed_output * routed_scaling_factor)")
