import pytest
import torch

from nnterp import Moe
from nnterp.testing import PROMPT, close, family_suite


def experts_reference(mlp, inputs, indices, weights, scale_inputs: bool = True) -> torch.Tensor:
    """Each slot's expert run on the input scaled by the slot's weight (Llama-4's), or with its output scaled, summed."""
    experts = mlp.experts._module
    routed = torch.zeros_like(inputs)
    for slot in range(indices.shape[-1]):
        weight, chosen = weights[..., slot, None], indices[..., slot]
        scaled = inputs * weight if scale_inputs else inputs
        gate, up = torch.einsum("bsh,bshi->bsi", scaled, experts.gate_up_proj[chosen]).chunk(2, dim=-1)
        output = torch.einsum("bsi,bsih->bsh", up * experts.act_fn(gate), experts.down_proj[chosen])
        routed += output if scale_inputs else output * weight
    return routed


def unchosen(indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """For each token, the first expert none of its slots chose, [batch, seq]."""
    taken = torch.zeros(*indices.shape[:-1], num_experts, dtype=torch.bool).scatter(-1, indices, True)
    return (~taken).int().argmax(-1)


class TestLlama4Text(family_suite("llama4_text")):
    def moe(self):
        layer = self.moe_layers()[0]
        return layer, self.model.layers[layer].mlp

    def test_the_dense_and_the_mixture_blocks_are_told_apart(self) -> None:
        assert [isinstance(layer.mlp, Moe) for layer in self.model.layers] == [False, True]

    def test_the_routed_output_is_the_experts_on_their_weighted_inputs(self) -> None:
        layer, mlp = self.moe()
        with self.model.trace(PROMPT):
            inputs = self.model.layers[layer].mlp_input.save()
            weights, indices = mlp.expert_weights.save(), mlp.expert_indices.save()
            routed = mlp.routed_output.save()
        with torch.no_grad():
            close(routed, experts_reference(mlp, inputs, indices, weights), what="routed output vs the experts")
            on_outputs = experts_reference(mlp, inputs, indices, weights, scale_inputs=False)
        assert not torch.allclose(routed, on_outputs, atol=1e-6), "the weights scale the experts' inputs, not outputs"

    def test_an_index_write_reroutes_the_slot_with_its_weight(self) -> None:
        layer, mlp = self.moe()
        with self.model.trace(PROMPT):
            inputs = self.model.layers[layer].mlp_input.save()
            weights = mlp.expert_weights.save()
            indices = mlp.expert_indices
            original = indices.clone().save()
            indices[..., 0] = unchosen(indices, mlp.num_experts)
            written = indices.save()
            routed = mlp.routed_output.save()
        assert not torch.equal(written, original)
        with torch.no_grad():
            close(routed, experts_reference(mlp, inputs, written, weights), what="routed output after the reroute")

    def test_an_in_place_weight_edit_reaches_the_model(self) -> None:
        layer, mlp = self.moe()
        with self.model.trace(PROMPT):
            inputs = self.model.layers[layer].mlp_input.save()
            weights = mlp.expert_weights
            weights[..., 0] *= 0.5
            edited = weights.clone().save()
            indices = mlp.expert_indices.save()
            routed = mlp.routed_output.save()
        with torch.no_grad():
            close(routed, experts_reference(mlp, inputs, indices, edited), what="routed output after the edit")

    def test_a_weight_read_leaves_the_model_as_it_was(self) -> None:
        with self.model.trace(PROMPT):
            clean = self.model.logits.save()
        with self.model.trace(PROMPT):
            self.moe()[1].expert_weights.save()
            read = self.model.logits.save()
        assert torch.equal(read, clean), "reading the weights changed the model"

    def test_a_weight_outside_the_sigmoid_range_is_refused(self) -> None:
        _, mlp = self.moe()
        with self.model.trace(PROMPT):
            clean = self.model.logits.save()
        with pytest.raises(ValueError, match="in \\[0, 1\\]"), self.model.trace(PROMPT):
            mlp.expert_weights = mlp.expert_weights + 1
        with self.model.trace(PROMPT):
            after = self.model.logits.save()
        assert torch.equal(after, clean)

    def test_the_shared_expert_output_is_what_the_shared_expert_computes(self) -> None:
        layer, mlp = self.moe()
        with self.model.trace(PROMPT):
            inputs = self.model.layers[layer].mlp_input.save()
            shared = mlp.shared_expert_output.save()
        with torch.no_grad():
            close(shared, mlp.shared_expert._module(inputs), what="shared expert output")

    def test_a_shared_expert_edit_reaches_the_mixture_output(self) -> None:
        _, mlp = self.moe()
        with self.model.trace(PROMPT):
            shared = mlp.shared_expert_output
            shared[:] = 0
            routed = mlp.routed_output.save()
            output = mlp.mlp_output.save()
        close(output, routed, what="mlp output with the shared expert zeroed in place")
