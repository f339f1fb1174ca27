from operator import attrgetter

import pytest
import torch

from nnterp.testing import PROMPT, LayerSuite, close, family_suite, tiny_standardized


def drawn(model, *names):
    """``model`` with each block's parameters or buffers ``names`` drawn from [0.5, 1.5), where they start at one."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for block in model._module.model.layers:
            for name in names:
                tensor = attrgetter(name)(block)
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
    return model


class TestGemma4Text(family_suite("gemma4_text")):
    @classmethod
    def build_model(cls):
        # Each of these starts at one, where leaving it out of the identities they enter would go unnoticed.
        return drawn(
            tiny_standardized(cls.family, **cls.load),
            "layer_scalar",
            "router.per_expert_scale",
            "post_feedforward_layernorm_1.weight",
            "post_feedforward_layernorm_2.weight",
        )

    def test_a_block_whose_keys_are_reused_refuses_to_be_skipped(self) -> None:
        with pytest.raises(ValueError, match=r"blocks \[3\] attend over its keys"), self.model.trace(PROMPT):
            self.model.layers[2].skip(self.model.layers[2].layer_input)
        with self.model.trace(PROMPT):
            entering = self.model.layers[1].layer_input.save()
            self.model.layers[1].skip(entering)
            received = self.model.layers[2].layer_input.save()
        close(received, entering, what="layers[2].layer_input after skipping layers[1], whose keys no block reuses")


class TestGemma4TextDense(LayerSuite):
    """A checkpoint without the mixture of experts or the per-layer input: the MLP alone, then the scaling.

    Without shared keys and values too: transformers (5.23 on) slices the per-layer inputs in front of the first block
    that reuses keys and values, and fails on a model that has no per-layer inputs.
    """

    family = "gemma4_text"
    load = {"enable_moe_block": False, "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0}

    @classmethod
    def build_model(cls):
        return drawn(tiny_standardized(cls.family, **cls.load), "layer_scalar")

    def test_the_mixture_values_say_the_checkpoint_has_none(self) -> None:
        support = self.model.support()
        for name in ("router_logits", "expert_weights", "routed_output", "shared_expert_output"):
            reasons = support[f"mlp.{name}"]
            assert reasons is not None and set(reasons) == set(range(self.model.num_layers)), name
            assert all("enable_moe_block" in reason for reason in reasons.values()), reasons
        assert support["mlp.mlp_neurons"] is None and support["mlp.mlp_output"] is None
