"""state_trajectory where the per-token states are not served: the model's own chunk size, and an optimized kernel."""

import pytest
import torch
from transformers.integrations import use_kernel_func_from_hub_with_fallback

from nnterp import route_kernels
from nnterp.components.recurrent import dispatch
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


def test_an_optimized_kernel_leaves_the_trajectory_available():
    family = REGISTRY.family("mamba2")
    modeling = family.MODELING
    imported = modeling.mamba2_chunk_scan
    try:
        # transformers' dispatcher finding an "optimized" kernel in an importable package (json stands in for mamba_ssm)
        modeling.mamba2_chunk_scan = use_kernel_func_from_hub_with_fallback("dumps", "json")(
            dispatch(imported).torch_function
        )
        model = tiny_standardized(family)
        support = model.support(layer=blocks_with(model, "linear_attn")[0])
    finally:
        modeling.mamba2_chunk_scan = imported
    assert "optimized kernel (json)" in support["linear_attn.attention_queries"]
    assert support["linear_attn.state_trajectory"] is None


def test_the_trajectory_follows_a_bfloat16_kernel():
    model = tiny_standardized("mamba2", dtype=torch.bfloat16)
    mixer = model.layers[blocks_with(model, "linear_attn")[0]].linear_attn
    saved: list = []
    with model.trace(PROMPT):
        saved.extend((mixer.state_trajectory.save(), mixer.trajectory(dtype=torch.float32).save()))
    assert saved[0].dtype == torch.bfloat16 and saved[1].dtype == torch.float32
    assert torch.equal(saved[0], saved[1].to(torch.bfloat16))
