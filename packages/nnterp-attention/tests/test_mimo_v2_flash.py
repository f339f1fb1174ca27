import torch

from nnterp import Moe
from nnterp.testing import LayerSuite, MoeSuite
from nnterp_attention.testing import SinkAttentionSuite


class TestMiMoV2Flash(LayerSuite, SinkAttentionSuite, MoeSuite):
    family = "mimo_v2_flash"

    @classmethod
    def build_model(cls):
        # The checkpoint's selection bias starts at zero; random values make the scoring's bias and groups decide.
        model = super().build_model()
        generator = torch.Generator().manual_seed(0)
        for layer in model.layers:
            if isinstance(layer.mlp, Moe):
                bias = layer.mlp.router_module().e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=generator) * 0.05)
            sinks = layer.self_attn._module.sinks
            if sinks is not None:
                # Sinks near zero take little of each row; drawn, a reference that ignores them fails.
                sinks.data.copy_(torch.randn(sinks.shape, generator=generator))
        return model

    def test_the_blocks_with_and_without_sinks_are_both_served(self) -> None:
        kinds = {layer.self_attn._module.sinks is not None for layer in self.model.layers}
        assert kinds == {True, False}, "the tiny config should hold a block of each kind"
        assert self.attention_blocks() == list(range(self.model.num_layers))
