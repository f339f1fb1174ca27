import torch

from nnterp.testing import PROMPT, close, family_suite


def experts_reference(mlp, inputs: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """DBRX's routed output: each slot's expert (a gated GLU) on the input, times the slot's weight, summed."""
    glu = mlp.experts.mlp._module
    shape = (-1, glu.ffn_hidden_size, glu.hidden_size)
    w1, v1, w2 = (getattr(glu, name).view(shape) for name in ("w1", "v1", "w2"))
    routed = torch.zeros_like(inputs)
    for slot in range(indices.shape[-1]):
        chosen = indices[..., slot]
        gate = glu.activation_fn(torch.einsum("bsh,bsfh->bsf", inputs, w1[chosen]))
        up = torch.einsum("bsh,bsfh->bsf", inputs, v1[chosen])
        routed += torch.einsum("bsf,bsfh->bsh", gate * up, w2[chosen]) * weights[..., slot, None]
    return routed


class TestDbrx(family_suite("dbrx")):
    def test_the_routed_output_is_the_weighted_experts(self) -> None:
        layer = self.moe_layers()[0]
        mlp = self.model.layers[layer].mlp
        with self.model.trace(PROMPT):
            inputs = self.model.layers[layer].mlp_input.save()
            weights, indices = mlp.expert_weights.save(), mlp.expert_indices.save()
            routed = mlp.routed_output.save()
        with torch.no_grad():
            close(routed, experts_reference(mlp, inputs, indices, weights), what="routed output vs the experts")

    def test_an_index_write_reroutes_the_slot_with_its_weight(self) -> None:
        """MoeSuite's reads the per-slot outputs, which DBRX's experts do not hold: here the routed sum shows it."""
        layer = self.moe_layers()[0]
        mlp = self.model.layers[layer].mlp
        with self.model.trace(PROMPT):
            inputs = self.model.layers[layer].mlp_input.save()
            weights = mlp.expert_weights.save()
            indices = mlp.expert_indices
            original = indices.clone().save()
            # Each token's slot 0 goes to the first expert none of its slots chose.
            taken = torch.zeros(*indices.shape[:-1], mlp.num_experts, dtype=torch.bool).scatter(-1, indices, True)
            indices[..., 0] = (~taken).int().argmax(-1)
            written = indices.clone().save()
            routed = mlp.routed_output.save()
        assert not torch.equal(written, original)
        with torch.no_grad():
            close(routed, experts_reference(mlp, inputs, written, weights), what="routed output after the reroute")
