"""state_trajectory where the per-token states are not served: the unrouted kernels, checked against a reference."""

import pytest

from nnterp import route_kernels
from nnterp.components.recurrent import ROUTE_HINT
from nnterp.registry import REGISTRY
from nnterp.testing import PROMPT, blocks_with, close_relative, tiny_standardized
from nnterp_deltanet.testing import reference_delta_rule

FAMILIES = ("qwen3_5_text", "kimi_linear")
ARGUMENTS = ("attention_queries", "attention_keys", "attention_values", "decays", "betas")


@pytest.mark.parametrize("family", FAMILIES)
def test_unrouted_chunked_kernel_serves_the_trajectory(family):
    route_kernels(REGISTRY.family(family), "default")
    model = tiny_standardized(family)
    layer = blocks_with(model, "linear_attn")[0]
    support = model.support(layer=layer)
    assert support["linear_attn.states"] == ROUTE_HINT, "this model runs the chunked kernel"
    assert support["linear_attn.attention_queries"] is None and support["linear_attn.state_trajectory"] is None
    mixer = model.layers[layer].linear_attn
    saved: list = []
    with model.trace(PROMPT):
        saved.append(mixer.state_trajectory.save())
        saved.extend(getattr(mixer, name).save() for name in ARGUMENTS)
        saved.append(mixer.state_output.save())
    trajectory, *arguments, leaving = saved
    expected, _ = reference_delta_rule(*arguments)
    close_relative(trajectory, expected, what="unrouted state_trajectory vs the reference delta rule")
    close_relative(trajectory[:, -1], leaving, what="unrouted state_trajectory[:, -1] vs the chunked kernel's state")
