"""Nemotron-H: a Mamba-2 block, an attention block, an MLP block and a mixture-of-experts block."""

import pytest

from nnterp import Unavailable
from nnterp.testing import PROMPT, MoeSuite, draw_selection_bias, family_suite
from nnterp_ssd.families.nemotron_h import LATENT


class BiasedRouter:
    @classmethod
    def build_model(cls):
        # A checkpoint's selection bias is learned; the tiny model's zeros would leave the scoring's bias unchecked.
        return draw_selection_bias(super().build_model(), 0.1)


class TestNemotronH(BiasedRouter, family_suite("nemotron_h")):
    pass


class TestNemotronHLatent(BiasedRouter, MoeSuite):
    """With moe_latent_size the experts run in a narrower space: routed_output is their sum projected back."""

    family = "nemotron_h"
    load = {"moe_latent_size": 8}

    def test_the_latent_slots_say_why_they_are_not_served(self) -> None:
        mlp = self.model.layers[self.moe_layers()[0]].mlp
        assert mlp.support()["expert_outputs"] == LATENT
        with pytest.raises(Unavailable, match="moe_latent_size"), self.model.trace(PROMPT):
            mlp.expert_outputs.save()
