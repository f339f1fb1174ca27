"""The Mamba-1 scan's adjoint against autograd through transformers' own token loop, and its route in a trace."""

import inspect
import math

import pytest
import torch
from transformers.models.mamba import modeling_mamba

from nnterp.analysis import attribution_patch
from nnterp.testing import PROMPT, mild_decays, tiny_standardized
from nnterp_mamba import gradients
from nnterp_mamba.gradients import SelectiveScanAdjoint, SelectiveScanRun, selective_scan_state_patch_estimates
from nnterp_mamba.trajectory import selective_scan_states

SCAN = inspect.unwrap(modeling_mamba.mamba_selective_scan)
#: The names of the scan's differentiable arguments, in SelectiveScanAdjoint's order.
ARGUMENTS = ("x", "dt", "A", "B", "C", "D", "dt_bias")
BATCH, CHANNELS, STATE_DIM = 2, 24, 16


def scan_arguments(seq: int, dtype: torch.dtype):
    """The scan's arguments at a trained Mamba's scale (S4D-real A, steps from 0.001 to 0.1 before the noise of
    ``dt``), each a leaf that takes a gradient."""
    generator = torch.Generator().manual_seed(3)
    x, C, B = (torch.randn(BATCH, size, seq, generator=generator) for size in (CHANNELS, STATE_DIM, STATE_DIM))
    dt = 0.5 * torch.randn(BATCH, CHANNELS, seq, generator=generator)
    steps = torch.exp(torch.linspace(math.log(1e-3), math.log(0.1), CHANNELS))
    dt_bias = steps + torch.log(-torch.expm1(-steps))  # the inverse of the softplus, as Mamba initializes it
    A = -torch.arange(1, STATE_DIM + 1, dtype=torch.float32).expand(CHANNELS, STATE_DIM).contiguous()
    D = torch.randn(CHANNELS, generator=generator)
    return [tensor.to(dtype).requires_grad_() for tensor in (x, dt, A, B, C, D, dt_bias)]


def gradients_of(output: torch.Tensor, weights: torch.Tensor, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad((output * weights).sum(), leaves))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_adjoint_is_autograd_through_the_token_loop(dtype):
    """Every argument's gradient (x, dt, A, B, C, D and the step bias, through the softplus), over 150 tokens."""
    leaves = scan_arguments(150, dtype)
    x, dt, A, B, C, D, dt_bias = leaves
    weights = torch.randn(BATCH, CHANNELS, 150, generator=torch.Generator().manual_seed(4), dtype=dtype)
    loop = SCAN(x, dt, A, B, C, D, delta_bias=dt_bias, delta_softplus=True)
    expected = gradients_of(loop, weights, leaves)
    routed = loop.detach() + SelectiveScanAdjoint.apply(*leaves, True, None, None)
    assert torch.equal(routed, loop.detach()), "the value is the kernel's own"
    for name, found, wanted in zip(ARGUMENTS, gradients_of(routed, weights, leaves), expected, strict=True):
        assert found.dtype == wanted.dtype
        torch.testing.assert_close(found, wanted, rtol=2e-4, atol=2e-4 * float(wanted.abs().max()), msg=name)


def test_the_state_gradients_are_the_adjoint_recurrence():
    """G_t = C_t dM/dy_t + exp(dt_{t+1} A) G_{t+1}: autograd through the states with a perturbation added to each."""
    x, dt, A, B, C, _, dt_bias = (tensor.detach() for tensor in scan_arguments(40, torch.float64))
    step = torch.nn.functional.softplus(dt + dt_bias[:, None])
    log_decay = step[..., None] * A[:, None]  # [batch, channels, seq, state_dim]
    perturbations = torch.zeros(BATCH, 40, CHANNELS, A.shape[1], dtype=torch.float64, requires_grad=True)
    state = torch.zeros(BATCH, CHANNELS, A.shape[1], dtype=torch.float64)
    outputs = []
    for t in range(40):
        state = log_decay[:, :, t].exp() * state + (step * x)[:, :, t, None] * B[:, None, :, t] + perturbations[:, t]
        outputs.append((state * C[:, None, :, t]).sum(-1))
    weights = torch.randn(BATCH, CHANNELS, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    (expected,) = torch.autograd.grad((torch.stack(outputs, -1) * weights).sum(), perturbations)
    found = gradients.selective_scan_state_gradients(log_decay.transpose(1, 2), C, weights)
    # float32 arithmetic against float64: within rounding of the largest gradient
    torch.testing.assert_close(found, expected.float(), rtol=1e-5, atol=1e-6 * float(expected.abs().max()))


def test_attribution_routes_every_mixers_backward_through_the_adjoint(monkeypatch):
    """attribution_patch's clean run takes the adjoint on each Mamba-1 mixer, chosen or not, and keeps the
    forward's values: the estimate equals the one with autograd's own backward through the loop, also where the
    routed backward estimates the states beside it (their estimate against the metric's derivative:
    tests/test_attribution.py)."""
    model = mild_decays(tiny_standardized("mamba", dtype=torch.float64))
    corrupt = "Hexxo wirld, thera"
    taken = []
    backward = SelectiveScanAdjoint.backward

    def counted(ctx, output_gradients):
        taken.append(output_gradients.shape)
        return backward(ctx, output_gradients)

    monkeypatch.setattr(SelectiveScanAdjoint, "backward", staticmethod(counted))
    routed = attribution_patch(model, PROMPT, corrupt, values=["layer_output", "linear_attn.states"], layers=[0])
    assert len(taken) == len(model.layers), "a mixer's backward ran through the token loop"
    assert routed["linear_attn.states"].scores.abs().max() > 0
    monkeypatch.setattr(type(model.layers[0].linear_attn), "backward_through_adjoint", lambda self, corrupt=None: None)
    looped = attribution_patch(model, PROMPT, corrupt, values=["layer_output"], layers=[0])["layer_output"]
    assert len(taken) == len(model.layers)
    assert looped.scores.abs().max() > 0
    torch.testing.assert_close(routed["layer_output"].scores, looped.scores, rtol=1e-4, atol=1e-9)


def test_the_state_patch_estimate_is_the_states_difference_times_the_adjoint():
    """(corrupt h_t - clean h_t) . G_t per token and channel, against the chunked trajectories and the adjoint, with
    the runs' x, B and steps apart from token 5 on: exactly zero before it."""
    x, dt, A, B, C, _, dt_bias = (tensor.detach() for tensor in scan_arguments(40, torch.float32))
    generator = torch.Generator().manual_seed(6)
    other = [tensor.clone() for tensor in (x, dt, B)]
    for tensor in other:
        tensor[..., 5:] += torch.randn(tensor[..., 5:].shape, generator=generator)
    runs = [
        SelectiveScanRun(torch.nn.functional.softplus(step + dt_bias[:, None]), inputs, keys, C, A)
        for inputs, step, keys in ((x, dt, B), other)
    ]
    weights = torch.randn(BATCH, 40, CHANNELS, generator=torch.Generator().manual_seed(7))
    found = selective_scan_state_patch_estimates(*runs, weights)

    states = [selective_scan_states(run.x, run.step, A, run.B, softplus=False) for run in runs]
    log_decay = runs[0].step.transpose(1, 2)[..., None] * A
    adjoint = gradients.selective_scan_state_gradients(log_decay, C, weights.transpose(1, 2))
    expected = ((states[1] - states[0]) * adjoint).sum(-1)
    assert found.shape == (BATCH, 40, CHANNELS)
    assert (found[:, :5] == 0).all(), "where the runs agree the estimate is not zero"
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-5 * float(expected.abs().max()))
    assert expected[:, 5:].abs().max() > 1e-2
