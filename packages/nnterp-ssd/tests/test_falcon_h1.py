"""Falcon-H1: the parallel block, a Mamba-2 mixer beside softmax attention, then an MLP."""

import torch

from nnterp.testing import PROMPT, close, family_suite


class TestFalconH1(family_suite("falcon_h1")):
    def test_contributions_are_the_scaled_outputs(self) -> None:
        model = self.model
        config = model._module.config
        with model.trace(PROMPT):
            mixer = model.layers[0].linear_attn
            attention = model.layers[0].self_attn
            mixer_output = mixer.output.save()
            mixer_contribution = mixer.attention_output.save()
            attention_output = attention.output[0].save()
            attention_contribution = attention.attention_output.save()
        close(
            mixer_contribution,
            mixer_output * config.ssm_out_multiplier,
            what="mixer contribution vs output * ssm_out_multiplier",
        )
        close(
            attention_contribution,
            attention_output * config.attention_out_multiplier,
            what="attention contribution vs output * attention_out_multiplier",
        )

    def test_assigned_mixer_contribution_reaches_layer_output(self) -> None:
        model = self.model
        with model.trace(PROMPT):
            entering = model.layers[0].layer_input.save()
            model.layers[0].linear_attn.attention_output = torch.zeros_like(
                model.layers[0].linear_attn.attention_output
            )
            attention = model.layers[0].self_attn.attention_output.save()
            mid = model.layers[0].layer_mid.save()
        close(mid, entering + attention, what="layer_mid after zeroing the mixer's contribution")
