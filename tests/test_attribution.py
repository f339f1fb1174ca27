"""Attribution patching on an attention model, a gated DeltaNet hybrid, a Mamba-1 and a Mamba-2.

Each estimate is ``(corrupt - clean) . dM/d(value)`` on its own cell: checked against the same
product taken from a trace of the one value, and the gradient against a difference quotient on a
float64 model (its norms still compute in float32, so the step is as small as that allows). How
far the first-order term carries to a whole patch is the method's, not the code's: the correlation
and sign agreement with exact patching of every cell are printed (``pytest -s``) and bounded loosely.
"""

from __future__ import annotations

import pytest
import torch

from nnterp import Unavailable
from nnterp.analysis import attribution_patch
from nnterp.analysis.attribution import answer_log_probability
from nnterp.testing import PROMPT, mild_decays, tiny_standardized

FAMILIES = ("llama", "qwen3_5_text", "mamba", "mamba2")  # Qwen3-Next's grouped experts refuse float64
#: As many tokens as PROMPT (the local tokenizer's tokens are characters), sharing its first two.
CORRUPT = "Hexxo wirld, thera"
VALUES = (
    "self_attn.attention_head_outputs",
    "linear_attn.attention_head_outputs",
    "linear_attn.attention_output",
    "mlp.mlp_output",
    "layer_output",
)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return mild_decays(tiny_standardized(request.param, dtype=torch.float64))


def metric_of(model):
    answer = []
    with torch.no_grad(), model.trace(PROMPT):
        answer.append(model.logits[0, -1].argmax().save())
    return answer_log_probability(int(answer[0]))


def owner_of(model, value: str, layer: int):
    owner_name, _, name = value.rpartition(".")
    block = model.layers[layer]
    return (getattr(block, owner_name) if owner_name else block), name


def patched(model, value: str, layer: int, cell: tuple, shift, metric) -> float:
    """The metric with ``value`` of block ``layer`` at ``cell`` (a position, or a position and a head) moved by
    ``shift(clean, corrupt)``."""
    owner, name = owner_of(model, value, layer)
    corrupt, read = [], []
    with torch.no_grad(), model.trace(CORRUPT):
        corrupt.append(getattr(owner, name).clone().save())
    with torch.no_grad(), model.trace(PROMPT):
        current = getattr(owner, name)
        index = (slice(None), *cell)
        current[index] = current[index] + shift(current[index], corrupt[0][index])
        read.append(metric(model.logits).save())
    return float(read[0])


def unmoved(clean, corrupt):
    return 0 * clean


def whole(clean, corrupt):
    return corrupt - clean


@pytest.mark.parametrize("value", VALUES)
def test_each_estimate_is_its_own_cells_difference_times_gradient(model, value):
    try:
        estimate = attribution_patch(model, PROMPT, CORRUPT, values=[value])[value]
    except Unavailable as error:
        pytest.skip(str(error))
    metric = metric_of(model)
    assert (estimate.scores[:, :2] == 0).all(), "positions where the prompts agree moved"
    for index, layer in enumerate(estimate.layers):
        owner, name = owner_of(model, value, layer)
        corrupt, clean, gradient = [], [], []
        with torch.no_grad(), model.trace(CORRUPT):
            corrupt.append(getattr(owner, name).clone().save())
        with model.trace(PROMPT):
            served = getattr(owner, name)
            clean.append(served.detach().clone().save())
            measured = metric(model.logits)
            with measured.backward():
                gradient.append(served.grad.save())
        product = ((corrupt[0] - clean[0]) * gradient[0])[0]
        expected = product.sum(-1) if value != "mlp.mlp_neurons" else product
        assert torch.allclose(estimate.scores[index], expected.float(), rtol=1e-5, atol=1e-9), f"layers[{layer}]"


@pytest.mark.parametrize("family", ["llama", "qwen3_5_text"])
def test_the_gradient_is_the_metrics_derivative(family):
    model = mild_decays(tiny_standardized(family, dtype=torch.float64))
    estimate = attribution_patch(model, PROMPT, CORRUPT)["layer_output"]
    metric = metric_of(model)
    block, position = divmod(int(estimate.scores.abs().argmax()), estimate.scores.shape[1])
    layer = estimate.layers[block]
    base = patched(model, "layer_output", layer, (position,), unmoved, metric)
    for step in (1e-4, 1e-5):
        moved = patched(model, "layer_output", layer, (position,), lambda c, d, s=step: s * (d - c), metric)
        quotient = (moved - base) / step
    assert quotient == pytest.approx(estimate.scores[block, position].item(), rel=1e-2)


def test_estimates_against_exact_patching_of_every_cell_are_reported(model):
    """Every (layer, position) of the stream patched whole, against the estimates: printed, and loosely bounded."""
    estimate = attribution_patch(model, PROMPT, CORRUPT, values=["layer_output"])["layer_output"]
    metric = metric_of(model)
    base = patched(model, "layer_output", 0, (0,), unmoved, metric)
    seq = estimate.scores.shape[1]
    exact = torch.tensor(
        [
            [patched(model, "layer_output", layer, (t,), whole, metric) - base for t in range(seq)]
            for layer in estimate.layers
        ]
    )
    moved = exact.abs() > 1e-9
    correlation = torch.corrcoef(torch.stack([estimate.scores.flatten(), exact.flatten()]))[0, 1].item()
    signs = (estimate.scores.sign() == exact.sign())[moved].float().mean().item()
    print(f"{model.family.__name__} layer_output: correlation {correlation:.3f}, sign agreement {signs:.3f}")
    assert moved.any() and signs > 0.5, f"sign agreement {signs:.3f}: no better than chance"


def test_unequal_prompts_and_unknown_values_are_refused():
    model = tiny_standardized("llama")
    with pytest.raises(ValueError, match="the clean prompt has 18 tokens and the corrupt one 4"):
        attribution_patch(model, PROMPT, "Hell")
    with pytest.raises(ValueError, match="attribution_patch estimates .*not \\['residual'\\]"):
        attribution_patch(model, PROMPT, CORRUPT, values=["residual"])
    with pytest.raises(Unavailable, match="no chosen block serves linear_attn.attention_output"):
        attribution_patch(model, PROMPT, CORRUPT, values=["linear_attn.attention_output"])


def test_a_value_without_a_gradient_is_unavailable():
    model = tiny_standardized("mamba")  # its per-channel head outputs are computed beside the scan
    with pytest.raises(Unavailable, match=r"no gradient for layers\[\d\] linear_attn.attention_head_outputs"):
        attribution_patch(model, PROMPT, CORRUPT, values=["linear_attn.attention_head_outputs"])
