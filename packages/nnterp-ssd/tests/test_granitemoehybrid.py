"""GraniteMoeHybrid: a Mamba-2 block and an attention block, each with experts beside a shared MLP, scaled into the stream."""

from nnterp.testing import PROMPT, LayerSuite, close, family_suite
from nnterp_ssd.families.granitemoehybrid import NO_EXPERTS


class TestGraniteMoeHybrid(family_suite("granitemoehybrid")):
    def test_written_parts_are_what_the_block_adds(self) -> None:
        # The parts are the model's own tensors: the block adds their written values, scaled by residual_multiplier.
        with self.model.trace(PROMPT):
            mlp = self.model.layers[self.moe_layers()[0]].mlp
            routed = mlp.routed_output.save()
            mlp.routed_output = routed * 3
            shared = mlp.shared_expert_output.save()
            mlp.shared_expert_output = shared * 2
            total = mlp.mlp_output.save()
        mlp = self.model.layers[self.moe_layers()[0]].mlp
        close(total, mlp.mixture_output(routed * 3, shared * 2), what="mlp_output after writing its parts")
        assert not mlp.mixture_output(routed, shared).allclose(routed + shared), (
            "the multiplier is 1: nothing is checked"
        )


class TestGraniteMoeHybridDense(LayerSuite):
    """Without experts the shared MLP is the whole feed-forward, and its neurons are served."""

    family = "granitemoehybrid"
    load = {"num_local_experts": 0}

    def test_the_mixture_values_say_there_are_no_experts(self) -> None:
        for layer in self.model.layers:
            support = layer.mlp.support()
            for name in ("router_logits", "expert_weights", "expert_outputs", "routed_output", "shared_expert_output"):
                assert support[name] == NO_EXPERTS, f"{name}: {support[name]}"
            assert support["mlp_activation"] is None and support["mlp_neurons"] is None
