"""Nemotron-H: a Mamba-2 block, an attention block, an MLP block and a mixture-of-experts block."""

import pytest
import torch

from nnterp import Moe, Unavailable
from nnterp.testing import PROMPT, AttentionSuite, LayerSuite, MoeSuite
from nnterp_ssd.families.nemotron_h import LATENT
from nnterp_ssd.testing import SSDSuite


class BiasedRouter:
    @classmethod
    def build_model(cls):
        # The checkpoint's selection bias starts at zero; random values make the scoring's bias and groups decide.
        model = super().build_model()
        generator = torch.Generator().manual_seed(0)
        for layer in model.layers:
            if isinstance(getattr(layer, "mlp", None), Moe):
                bias = layer.mlp.router_module().e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=generator) * 0.1)
        return model


class TestNemotronH(BiasedRouter, LayerSuite, AttentionSuite, SSDSuite, MoeSuite):
    family = "nemotron_h"


class TestNemotronHLatent(BiasedRouter, MoeSuite):
    """With moe_latent_size the experts run in a narrower space: routed_output is their sum projected back."""

    family = "nemotron_h"
    load = {"moe_latent_size": 8}

    def test_the_latent_slots_say_why_they_are_not_served(self) -> None:
        mlp = self.model.layers[self.moe_layers()[0]].mlp
        assert mlp.support()["expert_outputs"] == LATENT
        with pytest.raises(Unavailable, match="moe_latent_size"), self.model.trace(PROMPT):
            mlp.expert_outputs.save()
