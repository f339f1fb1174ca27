"""ZAYA: each addition a learned per-channel affine sum, and a router that reads the previous block's router state."""

import torch

from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT, close, draw_selection_bias, family_suite, tiny_standardized
from nnterp_attention.families.zaya import RESIDUAL_SCALINGS


def scaled_sum(scaling: torch.nn.Module, part: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
    """``(part + hidden_states_bias) * hidden_states_scale + (stream + residual_bias) * residual_scale``, by hand."""
    with torch.no_grad():
        return (part + scaling.hidden_states_bias) * scaling.hidden_states_scale + (
            stream + scaling.residual_bias
        ) * scaling.residual_scale


def moved_off_initial_values(model: StandardizedTransformer) -> StandardizedTransformer:
    """``model`` with its residual scalings, router-state scales and selection biases off their initial values.

    The routers' MLPs are drawn at unit scale, so the logits are far apart and differ by token (a random
    model's are within 1e-4 of each other, and route every token alike).
    """
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model._module.model.layers:
            for name in RESIDUAL_SCALINGS:
                # biases at the embeddings' scale: larger ones would make every token's stream alike
                for key, parameter in getattr(layer, name).named_parameters():
                    drawn = torch.rand(parameter.shape, generator=generator)
                    parameter.copy_(drawn + 0.5 if key.endswith("scale") else (drawn - 0.5) * 0.04)
            router = layer.mlp.gate
            if router.use_eda:
                router.router_states_scale.copy_(torch.rand(router.router_states_scale.shape, generator=generator))
            for projection in (router.router_mlp.fc1, router.router_mlp.fc2, router.router_mlp.out_proj):
                projection.weight.normal_(generator=generator)
    # the skip expert's -1 drawn too: some tokens choose it
    return draw_selection_bias(model, 0.1, bias="balancing_biases")


class TestZaya(family_suite("zaya")):
    @classmethod
    def build_model(cls):
        return moved_off_initial_values(super().build_model())

    def test_layer_output_is_the_scaled_sums_and_not_the_plain_one(self) -> None:
        for index, layer in enumerate(self.model.layers):
            parts: list[torch.Tensor] = []  # bound outside: a name first bound inside a trace does not survive it
            with self.model.trace(PROMPT):
                entering = layer.layer_input.save()
                parts.append(layer.self_attn.attention_output.save())
                mid = layer.layer_mid.save()
                parts.append(layer.mlp.mlp_output.save())
                leaving = layer.layer_output.save()
            assert not torch.allclose(entering + sum(parts), leaving, atol=1e-3), "the scalings had no effect"
            block = layer._module
            first, second = (getattr(block, name) for name in RESIDUAL_SCALINGS)
            close(scaled_sum(first, parts[0], entering), mid, what=f"layers[{index}]: layer_mid from its scaling")
            close(scaled_sum(second, parts[1], mid), leaving, what=f"layers[{index}]: layer_output from its scaling")

    def test_the_router_adds_the_previous_blocks_router_state(self) -> None:
        """Block 1's logits: router_mlp(down_proj(mlp_input) + down_proj_0(block 0's mlp_input) * router_states_scale)."""
        first, second = self.model.layers[0], self.model.layers[1]
        entering: list[torch.Tensor] = []  # bound outside: a name first bound inside a trace does not survive it
        with self.model.trace(PROMPT):
            entering.extend((first.mlp_input.save(), second.mlp_input.save()))
            logits = second.mlp.router_logits.save()
        routers = [layer.mlp.router_module() for layer in (first, second)]
        with torch.no_grad():
            state = routers[0].down_proj(entering[0])
            expected = routers[1].router_mlp(routers[1].down_proj(entering[1]) + state * routers[1].router_states_scale)
            alone = routers[1].router_mlp(routers[1].down_proj(entering[1]))
        close(logits, expected, what="layers[1].router_logits vs its router on its input and block 0's router state")
        assert (logits - alone).abs().max() > 0.1 * logits.abs().max(), "block 0's router state made no difference"

    def test_a_skipped_block_passes_on_the_router_state_it_was_given(self) -> None:
        model = moved_off_initial_values(tiny_standardized(self.family, num_hidden_layers=3))
        with model.trace(PROMPT):
            first = model.layers[0].mlp_input.save()
            model.layers[1].skip(model.layers[1].layer_input)
            entering = model.layers[2].mlp_input.save()
            logits = model.layers[2].mlp.router_logits.save()
        routers = [model.layers[i].mlp.router_module() for i in (0, 2)]
        with torch.no_grad():
            state = routers[0].down_proj(first)
            expected = routers[1].router_mlp(routers[1].down_proj(entering) + state * routers[1].router_states_scale)
        close(logits, expected, what="layers[2].router_logits with layers[1] skipped: block 0's state passed on")

    def test_the_skip_expert_reaches_the_experts_as_expert_zero_with_no_weight(self) -> None:
        mlp = self.model.layers[0].mlp
        skip = mlp.num_experts
        assert mlp.router_classes == skip + 1
        with self.model.trace(PROMPT):
            written = torch.full_like(mlp.router_logits, -30.0)
            written[..., skip] = 30.0
            mlp.router_logits = written
            written = mlp.router_logits.save()
            indices = mlp.expert_indices.save()
            weights = mlp.expert_weights.save()
            routed = mlp.routed_output.save()
        assert torch.count_nonzero(indices) == 0 and torch.count_nonzero(weights) == 0, (indices, weights)
        assert torch.count_nonzero(routed) == 0, "the skip expert computed something"
        expected_indices, expected_weights = mlp.route(written)
        assert torch.equal(expected_indices, indices) and torch.equal(expected_weights, weights.float())

    def test_an_index_write_sends_the_slot_to_that_expert_with_its_weight(self) -> None:
        """One slot per token: a written index runs the token through that expert, scaled by the router's weight."""
        mlp = self.model.layers[0].mlp
        with self.model.trace(PROMPT):
            entering = self.model.layers[0].mlp_input.save()
            weights = mlp.expert_weights.save()
            indices = mlp.expert_indices
            chosen = ((indices + 1) % mlp.num_experts).save()
            mlp.expert_indices = chosen
            routed = mlp.routed_output.save()
        experts = mlp.experts_module()
        with torch.no_grad():
            gate, up = torch.einsum("bsh,bsih->bsi", entering, experts.gate_up_proj[chosen[..., 0]]).chunk(2, dim=-1)
            out = torch.einsum("bsi,bshi->bsh", experts.act_fn(gate) * up, experts.down_proj[chosen[..., 0]])
        close(routed, out * weights, atol=1e-5, what="routed_output vs the written expert on mlp_input, weighted")

    def test_a_layer_mid_write_reaches_the_float32_residual_of_a_bfloat16_model(self) -> None:
        """The stream stays float32 in a bfloat16 model, and the MLP's norm gets a bfloat16 copy: the write is the residual."""
        model = tiny_standardized(self.family, dtype=torch.bfloat16)
        layer = model.layers[0]
        with model.trace(PROMPT):
            written = (torch.randn_like(layer.layer_mid) * 0.1).save()
            layer.layer_mid = written
            received = layer.mlp_norm_output.save()
            added = layer.mlp.mlp_output.save()
            leaving = layer.layer_output.save()
        block = layer._module
        assert written.dtype == leaving.dtype == torch.float32
        with torch.no_grad():
            normed = block.post_attention_layernorm(written.to(torch.bfloat16))
            expected = scaled_sum(block.post_mlp_residual_scale, added, written)
        close(received, normed, what="mlp_norm_output after assigning layer_mid")
        close(leaving, expected, atol=1e-2, what="layer_output vs the second scaling of the written layer_mid")
