"""state_trajectory where the per-token states are not served: unrouted kernels, and an optimized kernel installed."""

import pytest
import torch
from transformers.integrations import use_kernel_func_from_hub_with_fallback

from nnterp import route_kernels
from nnterp.components.recurrent import ROUTE_HINT, dispatch
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


def test_an_optimized_kernel_leaves_the_trajectory_available():
    family = REGISTRY.family("qwen3_5_text")
    modeling = family.MODELING
    route_kernels(family, "default")
    imported = modeling.torch_chunk_gated_delta_rule
    try:
        # transformers' dispatcher finding an "optimized" kernel in an importable package (json stands in for fla)
        modeling.torch_chunk_gated_delta_rule = use_kernel_func_from_hub_with_fallback("dumps", "json")(
            dispatch(imported).torch_function
        )
        model = tiny_standardized(family)
        support = model.support(layer=blocks_with(model, "linear_attn")[0])
    finally:
        modeling.torch_chunk_gated_delta_rule = imported
    assert "optimized kernel (json)" in support["linear_attn.attention_queries"]
    assert support["linear_attn.state_trajectory"] is None


def test_the_trajectory_follows_a_bfloat16_kernel():
    route_kernels(REGISTRY.family("qwen3_5_text"), "default")
    model = tiny_standardized("qwen3_5_text", dtype=torch.bfloat16)
    mixer = model.layers[blocks_with(model, "linear_attn")[0]].linear_attn
    saved: list = []
    with model.trace(PROMPT):
        saved.extend((mixer.state_trajectory.save(), mixer.trajectory(dtype=torch.float32).save()))
    assert saved[0].dtype == torch.bfloat16 and saved[1].dtype == torch.float32
    assert torch.equal(saved[0], saved[1].to(torch.bfloat16))
