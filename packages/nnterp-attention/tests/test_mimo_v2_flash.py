import torch

from nnterp import Moe
from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite


class TestMiMoV2Flash(LayerSuite, AttentionSuite, MoeSuite):
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
        return model
