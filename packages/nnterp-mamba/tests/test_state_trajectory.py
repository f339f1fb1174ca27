"""state_trajectory where the per-token states are not served: the unrouted kernels, checked against a reference."""

import pytest

from nnterp import route_kernels
from nnterp.registry import REGISTRY
from nnterp.testing import PROMPT, blocks_with, close_relative, tiny_standardized
from nnterp_mamba.selective_scan import UNROUTED
from nnterp_mamba.testing import selective_scan_reference

ARGUMENTS = ("attention_values", "betas", "decays", "attention_keys", "attention_queries")


@pytest.mark.parametrize("family", ["mamba", "jamba"])
def test_unrouted_scan_serves_the_trajectory(family):
    route_kernels(REGISTRY.family(family), "default")
    model = tiny_standardized(family)
    layer = blocks_with(model, "linear_attn")[0]
    support = model.support(layer=layer)
    assert support["linear_attn.states"] == UNROUTED, "this model runs the dispatcher's scan"
    assert support["linear_attn.attention_queries"] is None and support["linear_attn.state_trajectory"] is None
    mixer = model.layers[layer].linear_attn
    saved: list = []
    with model.trace(PROMPT):
        saved.append(mixer.state_trajectory.save())
        saved.extend(getattr(mixer, name).save() for name in ARGUMENTS)
        saved.append(mixer.state_output.save())
    trajectory, *arguments, leaving = saved
    expected, _ = selective_scan_reference(*arguments, D=mixer._module.D.detach())
    close_relative(trajectory, expected, "unrouted state_trajectory vs a reference scan of the served values")
    close_relative(trajectory[:, -1], leaving, "unrouted state_trajectory[:, -1] vs the scan's final state")
