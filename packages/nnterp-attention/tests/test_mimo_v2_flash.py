import torch

from nnterp.testing import draw_selection_bias, family_suite


class TestMiMoV2Flash(family_suite("mimo_v2_flash")):
    @classmethod
    def build_model(cls):
        # A checkpoint's selection bias is learned; the tiny model's zeros would leave the scoring's bias unchecked.
        model = draw_selection_bias(super().build_model(), 0.05)
        generator = torch.Generator().manual_seed(1)
        for layer in model.layers:
            sinks = layer.self_attn._module.sinks
            if sinks is not None:
                # Sinks near zero take little of each row; drawn, a reference that ignores them fails.
                sinks.data.copy_(torch.randn(sinks.shape, generator=generator))
        return model

    def test_the_blocks_with_and_without_sinks_are_both_served(self) -> None:
        kinds = {layer.self_attn._module.sinks is not None for layer in self.model.layers}
        assert kinds == {True, False}, "the tiny config should hold a block of each kind"
        assert self.attention_blocks() == list(range(self.model.num_layers))
