import torch

from nnterp import Moe
from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite
from nnterp_deltanet.testing import DeltaNetSuite


class TestKimiLinear(LayerSuite, AttentionSuite, DeltaNetSuite, MoeSuite):
    family = "kimi_linear"

    @classmethod
    def build_model(cls):
        model = super().build_model()
        # A checkpoint's selection bias is non-zero; the initial zeros would leave the scoring's bias unchecked.
        generator = torch.Generator().manual_seed(0)
        for layer in model.layers:
            if isinstance(layer.mlp, Moe):
                bias = layer.mlp.router_module().e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=generator) * 0.02)
        return model
