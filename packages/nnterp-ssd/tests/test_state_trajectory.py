"""state_trajectory where the per-token states are not served: the model's own chunk size, checked against a reference."""

import pytest

from nnterp import route_kernels
from nnterp.registry import REGISTRY
from nnterp.testing import PROMPT, blocks_with, close_relative, tiny_standardized
from nnterp_ssd.testing import ARGUMENT_VALUES, ssd_reference


@pytest.mark.parametrize("family", ["mamba2", "falcon_h1"])
def test_chunked_scan_serves_the_trajectory(family):
    route_kernels(REGISTRY.family(family), "default")
    model = tiny_standardized(family)
    layer = blocks_with(model, "linear_attn")[0]
    support = model.support(layer=layer)
    assert "chunk_per_token" in support["linear_attn.states"], "this model's scan keeps only chunk boundaries"
    assert support["linear_attn.attention_queries"] is None and support["linear_attn.state_trajectory"] is None
    mixer = model.layers[layer].linear_attn
    values: dict = {}
    with model.trace(PROMPT):
        values["trajectory"] = mixer.state_trajectory.save()
        values.update({name: getattr(mixer, name).save() for name in ARGUMENT_VALUES if name != "state_input"})
        values["state_output"] = mixer.state_output.save()
    expected, _ = ssd_reference(mixer, values)
    close_relative(values["trajectory"], expected, "state_trajectory vs the recurrence of the served values")
    close_relative(values["trajectory"][:, -1], values["state_output"], "state_trajectory[:, -1] vs the final state")
