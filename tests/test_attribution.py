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

import nnterp
from nnterp import REGISTRY, Unavailable, route_kernels
from nnterp.analysis import attribution_patch
from nnterp.analysis.attribution import ESTIMATED, answer_log_probability
from nnterp.testing import PROMPT, mild_decays, tiny_standardized

FAMILIES = ("llama", "qwen3_5_text", "mamba", "mamba2", "falcon_h1")  # Qwen3-Next's grouped experts refuse float64
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
        # a value the model has must be estimated: only one no block has is skipped
        assert "no chosen block serves" in str(error), str(error)
        pytest.skip(str(error))
    metric = metric_of(model)
    assert (estimate.scores[:, :2] == 0).all(), "positions where the prompts agree moved"
    for index, layer in enumerate(estimate.layers):
        owner, name = owner_of(model, value, layer)
        corrupt, clean, measured = [], [], []
        with torch.no_grad(), model.trace(CORRUPT):
            corrupt.append(getattr(owner, name).clone().save())
        with model.trace(PROMPT):
            # the value replaced by a leaf of its own: autograd's gradient of the metric with respect to it
            leaf = getattr(owner, name).detach().clone().requires_grad_()
            setattr(owner, name, leaf)
            clean.append(leaf.save())
            measured.append(metric(model.logits).save())
        (gradient,) = torch.autograd.grad(measured[0], clean[0])
        product = ((corrupt[0] - clean[0].detach()) * gradient)[0]
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


@pytest.mark.parametrize("name", ["falcon_h1", "zamba"])
def test_every_value_at_once_is_each_alone_whichever_mixer_a_block_runs_first(name):
    """Falcon-H1's block runs its Mamba-2 mixer before its attention, Zamba's its attention before its Mamba mixer:
    one call reads every value of both in the order the forward makes them."""
    model = tiny_standardized(name, dtype=torch.float64)
    alone = {}
    for value in ESTIMATED:
        try:
            alone[value] = attribution_patch(model, PROMPT, CORRUPT, values=[value])[value]
        except Unavailable:
            continue
    assert {"self_attn.attention_output", "linear_attn.attention_output"} <= alone.keys()
    together = attribution_patch(model, PROMPT, CORRUPT, values=list(alone))
    for value, estimate in alone.items():
        assert together[value].layers == estimate.layers
        torch.testing.assert_close(together[value].scores, estimate.scores, rtol=1e-6, atol=1e-12, msg=value)


def test_unequal_prompts_and_unknown_values_are_refused():
    model = tiny_standardized("llama")
    with pytest.raises(ValueError, match="the clean prompt has 18 tokens and the corrupt one 4"):
        attribution_patch(model, PROMPT, "Hell")
    with pytest.raises(ValueError, match="attribution_patch estimates .*not \\['residual'\\]"):
        attribution_patch(model, PROMPT, CORRUPT, values=["residual"])
    with pytest.raises(Unavailable, match="no chosen block serves linear_attn.attention_output"):
        attribution_patch(model, PROMPT, CORRUPT, values=["linear_attn.attention_output"])


def test_a_value_without_a_gradient_is_unavailable():
    model = tiny_standardized("bloom")  # its head outputs are a reshaped copy, which the forward does not go on with
    with pytest.raises(Unavailable, match=r"no gradient for layers\[\d\] self_attn.attention_head_outputs"):
        attribution_patch(model, PROMPT, CORRUPT, values=["self_attn.attention_head_outputs"])
    assert_parameters_as_they_were(model, frozen=set())


def assert_parameters_as_they_were(model, frozen: set[str]):
    for name, parameter in model._module.named_parameters():
        assert parameter.requires_grad == (name not in frozen), name
        assert parameter.grad is None, f"{name} took a gradient"


@pytest.mark.parametrize("name", ["llama", "mamba"])
def test_the_parameters_take_no_gradient_and_are_left_as_they_were(name):
    """The backward computes the activations' gradients only (a weight's would double each linear layer's work);
    every parameter takes a gradient after as before, and a frozen one stays frozen."""
    model = tiny_standardized(name)
    frozen = {next(name for name, _ in model._module.named_parameters() if "layers" in name)}
    model._module.get_parameter(next(iter(frozen))).requires_grad_(False)
    values = ["layer_output"] + (["linear_attn.states"] if name == "mamba" else ["mlp.mlp_output"])
    estimates = attribution_patch(model, PROMPT, CORRUPT, values=values)
    assert all(estimate.scores.abs().max() > 0 for estimate in estimates.values())
    assert_parameters_as_they_were(model, frozen)


#: The step of each family's state derivative's central difference: one the routed kernel's float32 state arithmetic
#: resolves. Mamba-1's scan runs in float32 in a float64 model, so its metric moves in float32's steps: the whole patch
#: either way, where the metric is all but linear in the state.
STEPS = {"qwen3_5_text": 1e-2, "mamba": 1.0}


@pytest.mark.filterwarnings(r"ignore:route_kernels\(\.\.\., 'torch'\):UserWarning")
@pytest.mark.parametrize("name", ["qwen3_5_text", "mamba"])
def test_a_state_estimate_is_the_metrics_derivative_along_the_patch(name):
    """The estimate for the state after token t is the derivative of the metric as that state moves toward the
    corrupt run's (``set_state_after`` on a routed model), at the last token and at ones whose gradient runs back
    through the recurrence: a gated DeltaNet's, and a Mamba-1's, whose head outputs' gradient is the one its scan's
    adjoint route starts from."""
    family = getattr(nnterp.families, name)
    route_kernels(family, "torch")
    try:
        model = mild_decays(tiny_standardized(name, dtype=torch.float64))
        estimate = attribution_patch(model, PROMPT, CORRUPT, values=["linear_attn.states"])["linear_attn.states"]
        metric = metric_of(model)
        assert (estimate.scores[:, :2] == 0).all(), "positions where the prompts agree moved"
        layer = estimate.layers[0]
        mixer = model.layers[layer].linear_attn
        states = []
        for prompt in (PROMPT, CORRUPT):
            with torch.no_grad(), model.trace(prompt):
                states.append(mixer.state_trajectory.save())
        clean, corrupt = states
        seq = clean.shape[1]
        for t in (seq - 1, seq - 2, 3):
            for head in (None, 0):
                shift = corrupt[:, t] - clean[:, t]
                if head is not None:
                    kept = torch.zeros_like(shift)
                    kept[:, head] = shift[:, head]
                    shift = kept
                moved = []
                for step in (STEPS[name], -STEPS[name]):
                    with torch.no_grad(), model.trace(PROMPT):
                        mixer.set_state_after(t, clean[:, t] + step * shift)
                        moved.append(metric(model.logits).save())
                quotient = float(moved[0] - moved[1]) / (2 * STEPS[name])
                # the metric's own rounding, over the step
                resolution = torch.finfo(moved[0].dtype).eps * abs(float(moved[0])) / STEPS[name]
                expected = estimate.scores[0, t].sum() if head is None else estimate.scores[0, t, head]
                assert quotient == pytest.approx(expected.item(), rel=5e-3, abs=2 * resolution), (t, head)
    finally:
        route_kernels(family, "default")


def test_a_state_of_a_kind_without_its_gradient_is_unavailable():
    model = tiny_standardized("rwkv")
    with pytest.raises(Unavailable, match=r"does not say how its states' gradient runs back"):
        attribution_patch(model, PROMPT, CORRUPT, values=["linear_attn.states"])


def test_a_mamba2_state_gradient_is_autograd_through_its_recurrence():
    """The scan's adjoint, from a served call's decays and C, equals autograd through the recurrence written out:
    ``h_t = exp(dt_t A) h_{t-1} + E_t``, ``y_t = h_t^T C_t``, with ``E_t`` the perturbation of the state after t."""
    model = mild_decays(tiny_standardized("mamba2", dtype=torch.float64))
    mixer = model.layers[0].linear_attn
    inputs, trajectory = [], []
    with torch.no_grad(), model.trace(PROMPT):
        for tensor in mixer.state_gradient_inputs():
            inputs.append(tensor.save())
        trajectory.append(mixer.state_trajectory.save())
    log_decay, C = (tensor.double() for tensor in inputs)
    batch, seq, heads, state_dim, head_dim = trajectory[0].shape
    weights = torch.randn(batch, seq, heads, head_dim, dtype=torch.float64)
    perturbations = torch.zeros(batch, seq, heads, state_dim, head_dim, dtype=torch.float64, requires_grad=True)
    reading = C.repeat_interleave(heads // C.shape[2], dim=2)
    state, measured = torch.zeros(batch, heads, state_dim, head_dim, dtype=torch.float64), 0
    for t in range(seq):
        state = log_decay[:, t, :, None, None].exp() * state + perturbations[:, t]
        measured = measured + (torch.einsum("bhn,bhnp->bhp", reading[:, t], state) * weights[:, t]).sum()
    measured.backward()
    adjoint = type(mixer).state_gradients(tuple(inputs), weights)
    torch.testing.assert_close(adjoint.double(), perturbations.grad, rtol=1e-5, atol=1e-7)
    assert perturbations.grad[:, 0].abs().max() > 1e-3, "the first state's gradient is all but zero: nothing checked"


def test_a_mamba2_state_estimate_is_the_state_patch_times_its_gradient():
    model = mild_decays(tiny_standardized("mamba2", dtype=torch.float64))
    estimate = attribution_patch(model, PROMPT, CORRUPT, values=["linear_attn.states"])["linear_attn.states"]
    metric = metric_of(model)
    for index, layer in enumerate(estimate.layers):
        mixer = model.layers[layer].linear_attn
        corrupt, clean, inputs, gradient = [], [], [], []
        with torch.no_grad(), model.trace(CORRUPT):
            corrupt.append(mixer.state_trajectory.save())
        with model.trace(PROMPT):
            for tensor in mixer.state_gradient_inputs():
                inputs.append(tensor.save())
            clean.append(mixer.state_trajectory.save())
            outputs = mixer.attention_head_outputs
            with metric(model.logits).backward():
                gradient.append(outputs.grad.save())
        adjoint = type(mixer).state_gradients(tuple(inputs), gradient[0])
        expected = ((corrupt[0] - clean[0]) * adjoint).sum((-2, -1))[0]
        assert estimate.scores[index].shape == (len(PROMPT), mixer.mixer_heads)
        torch.testing.assert_close(estimate.scores[index], expected.float(), rtol=1e-5, atol=1e-9)
        assert estimate.scores[index].abs().max() > 1e-6, f"layers[{layer}]: the estimate is all but zero"


@pytest.mark.parametrize("name", ["qwen3_5_text", "mamba", "mamba2"])
def test_a_kind_declaring_only_its_state_gradients_is_estimated_by_the_default(name, monkeypatch):
    """``RecurrentMixer.state_patch_inputs`` and ``state_patch_estimates`` by default (the adjoint times the
    difference of the two trajectories), which a plugin declaring only ``state_gradients`` gets, give what each
    shipped kind's own estimate gives: in chunks, or in Mamba-1's routed backward (its route then left to route
    the head outputs' gradient only)."""
    model = mild_decays(tiny_standardized(name, dtype=torch.float64))
    own = attribution_patch(model, PROMPT, CORRUPT, values=["linear_attn.states"])["linear_attn.states"]
    kind = type(model.layers[own.layers[0]].linear_attn)
    route = kind.backward_through_adjoint
    monkeypatch.setattr(kind, "backward_through_adjoint", lambda self, corrupt=None: route(self))
    monkeypatch.setattr(kind, "state_patch_inputs", nnterp.RecurrentMixer.state_patch_inputs)
    monkeypatch.setattr(
        kind, "state_patch_estimates", classmethod(nnterp.RecurrentMixer.state_patch_estimates.__func__)
    )
    default = attribution_patch(model, PROMPT, CORRUPT, values=["linear_attn.states"])["linear_attn.states"]
    assert own.scores.abs().max() > 1e-6
    torch.testing.assert_close(default.scores, own.scores, rtol=1e-4, atol=1e-9)


def test_a_model_whose_cache_is_updated_in_place_is_attributed():
    """RWKV's forward writes its cache's states in place, which autograd cannot run back through: the runs go
    without a cache."""
    model = tiny_standardized("rwkv")
    estimate = attribution_patch(model, PROMPT, CORRUPT, values=["layer_output"])["layer_output"]
    assert torch.isfinite(estimate.scores).all() and estimate.scores.abs().max() > 0


def test_blocks_of_different_widths_are_padded_with_nan():
    if "gemma4_text" not in REGISTRY.families():
        pytest.skip("this transformers has no Gemma 4")
    model = tiny_standardized("gemma4_text")
    estimate = attribution_patch(model, PROMPT, CORRUPT, values=["mlp.mlp_neurons"])["mlp.mlp_neurons"]
    widths = []
    with torch.no_grad(), model.trace(PROMPT):
        for layer in estimate.layers:
            widths.append(model.layers[layer].mlp.mlp_neurons.shape[-1])
    assert len(set(widths)) > 1, "every block is as wide: nothing padded"
    assert estimate.scores.shape[-1] == max(widths)
    for scores, width in zip(estimate.scores, widths, strict=True):
        assert torch.isfinite(scores[:, :width]).all() and scores[:, width:].isnan().all()


def test_unavailable_asks_one_value_as_support_asks_them_all():
    """The owner check asks one value (unavailable(name) is support()[name], the reason where a value is missing:
    Mamba-1's states without routing); None for a name that is no value."""
    model = tiny_standardized("mamba")
    modules = [model.layers[0], model.layers[0].linear_attn]
    reasons = [(module.support(), module) for module in modules]
    for support, module in reasons:
        assert {name: module.unavailable(name) for name in support} == support
        assert module.unavailable("no_such_value") is None
    assert model.layers[0].linear_attn.unavailable("states") is not None
