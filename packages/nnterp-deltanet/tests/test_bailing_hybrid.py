import pytest

pytest.importorskip("transformers.models.bailing_hybrid", reason="Bailing-Hybrid ships from transformers 5.20")

import torch  # noqa: E402

from nnterp import Moe  # noqa: E402
from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite  # noqa: E402
from nnterp_deltanet.testing import DeltaNetSuite  # noqa: E402


class TestBailingHybrid(LayerSuite, AttentionSuite, DeltaNetSuite, MoeSuite):
    family = "bailing_hybrid"

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
