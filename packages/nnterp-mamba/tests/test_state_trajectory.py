"""state_trajectory where the per-token states are not served: unrouted kernels, and an optimized kernel installed."""

import pytest
import torch
from transformers.integrations import use_kernel_func_from_hub_with_fallback

from nnterp import route_kernels
from nnterp.components.recurrent import dispatch
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


def test_an_optimized_kernel_leaves_the_trajectory_available():
    family = REGISTRY.family("mamba")
    modeling = family.MODELING
    route_kernels(family, "default")
    imported = modeling.mamba_selective_scan
    try:
        # transformers' dispatcher finding an "optimized" kernel in an importable package (json stands in for mamba_ssm)
        modeling.mamba_selective_scan = use_kernel_func_from_hub_with_fallback("dumps", "json")(
            dispatch(imported).torch_function
        )
        model = tiny_standardized(family)
        support = model.support(layer=blocks_with(model, "linear_attn")[0])
    finally:
        modeling.mamba_selective_scan = imported
    assert "optimized kernel (json)" in support["linear_attn.attention_queries"]
    assert support["linear_attn.state_trajectory"] is None


def test_the_trajectory_follows_a_bfloat16_kernel():
    route_kernels(REGISTRY.family("mamba"), "default")
    model = tiny_standardized("mamba", dtype=torch.bfloat16)
    mixer = model.layers[blocks_with(model, "linear_attn")[0]].linear_attn
    saved: list = []
    with model.trace(PROMPT):
        saved.extend((mixer.state_trajectory.save(), mixer.trajectory(dtype=torch.float32).save()))
    assert saved[0].dtype == torch.bfloat16 and saved[1].dtype == torch.float32
    assert torch.equal(saved[0], saved[1].to(torch.bfloat16))
