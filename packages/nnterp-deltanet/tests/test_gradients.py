"""The delta rule's adjoint against autograd, and its state patch estimate in chunks against the product written out."""

import pytest
import torch
import torch.nn.functional as F

from nnterp_deltanet.gradients import DeltaRuleRun, delta_rule_state_gradients, delta_rule_state_patch_estimates
from nnterp_deltanet.mixing import reading_queries
from nnterp_deltanet.trajectory import delta_rule_states

BATCH, KEY_HEADS, HEADS, KEY_DIM, VALUE_DIM = 2, 2, 4, 6, 5


def run(seq: int, seed: int, per_channel: bool = False) -> DeltaRuleRun:
    """A call's arguments, decays mild to strong (one per head, or per key channel as Kimi's), and an entering state."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=generator)

    key_heads = HEADS if per_channel else KEY_HEADS
    gate_shape = (BATCH, seq, HEADS, KEY_DIM) if per_channel else (BATCH, seq, HEADS)
    decay_rate = torch.linspace(0.05, 4.0, HEADS).view(HEADS, *([1] * (len(gate_shape) - 3)))
    return DeltaRuleRun(
        normal(BATCH, seq, key_heads, KEY_DIM),
        normal(BATCH, seq, key_heads, KEY_DIM),
        normal(BATCH, seq, HEADS, VALUE_DIM),
        -decay_rate * F.softplus(normal(*gate_shape) - 2.0),
        torch.sigmoid(normal(BATCH, seq, HEADS)),
        normal(BATCH, HEADS, KEY_DIM, VALUE_DIM),
    )


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_state_gradients_are_autograd_through_the_delta_rule(per_channel):
    """``o_t = S_t^T q_t`` with ``S_t = A_t S_{t-1} + beta_t k_t v_t^T + E_t``: the adjoint is the gradient with
    respect to the perturbation ``E_t`` of the state after each token."""
    seq = 9
    call = run(seq, 0, per_channel)
    weights = torch.randn(BATCH, seq, HEADS, VALUE_DIM, generator=torch.Generator().manual_seed(1))
    found = delta_rule_state_gradients(call.query, call.key, call.g, call.beta, weights, use_qk_l2norm=True)

    perturbations = torch.zeros(BATCH, seq, HEADS, KEY_DIM, VALUE_DIM, dtype=torch.float64, requires_grad=True)
    key = call.key.repeat_interleave(HEADS // call.key.shape[2], dim=2).double()
    key = key / (key.square().sum(-1, keepdim=True) + 1e-6).sqrt()
    reading = reading_queries(call.query.repeat_interleave(HEADS // call.query.shape[2], dim=2), True).double()
    decay = call.g.double().exp()
    decay = decay.unsqueeze(-1) if per_channel else decay[..., None, None]
    state, measured = call.entering.double(), 0
    for t in range(seq):
        state = decay[:, t] * state
        correction = call.beta[:, t, :, None].double() * (
            call.value[:, t].double() - torch.einsum("bhk,bhkv->bhv", key[:, t], state)
        )
        state = state + key[:, t, :, :, None] * correction[:, :, None, :] + perturbations[:, t]
        measured = measured + (torch.einsum("bhk,bhkv->bhv", reading[:, t], state) * weights[:, t]).sum()
    measured.backward()
    torch.testing.assert_close(found.double(), perturbations.grad, rtol=1e-4, atol=1e-5)
    assert perturbations.grad[:, 0].abs().max() > 1e-3, "the first state's gradient is all but zero: nothing checked"


@pytest.mark.parametrize(
    "seq, chunk_size, per_channel, l2_norms",
    [
        (11, 4, False, True),
        (12, 4, False, True),
        (11, 64, False, True),
        (30, 7, False, False),
        (30, 7, True, True),
        (1, 3, False, True),
        (13, 5, True, False),
    ],
)
def test_the_estimate_in_chunks_is_the_state_patch_times_the_adjoint(seq, chunk_size, per_channel, l2_norms):
    """Whole chunks and a partial last one, a single token, both runs from their own entering states, keys and
    queries normalized in the kernel or not. One decay per head pairs whole chunks; one per key channel (KDA) steps
    a chunk of states at a time."""
    clean, corrupt = run(seq, 0, per_channel), run(seq, 1, per_channel)
    if not l2_norms:  # keys of about unit norm, as a model that does not normalize them learns: beta k k^T < 2
        clean, corrupt = (call._replace(key=call.key / KEY_DIM**0.5) for call in (clean, corrupt))
    weights = torch.randn(BATCH, seq, HEADS, VALUE_DIM, generator=torch.Generator().manual_seed(2))
    adjoint = delta_rule_state_gradients(clean.query, clean.key, clean.g, clean.beta, weights, use_qk_l2norm=l2_norms)
    states = [delta_rule_states(*call, use_qk_l2norm=l2_norms, dtype=torch.float32) for call in (clean, corrupt)]
    expected = ((states[1] - states[0]) * adjoint).sum((-2, -1))
    found = delta_rule_state_patch_estimates(clean, corrupt, weights, use_qk_l2norm=l2_norms, chunk_size=chunk_size)
    assert found.shape == (BATCH, seq, HEADS) and found.dtype == torch.float32
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-4)
    assert expected[:, 0].abs().max() > 1e-2, "the first token's estimate is all but zero: nothing checked"


def test_a_run_against_itself_estimates_nothing():
    clean = run(20, 0)
    weights = torch.randn(BATCH, 20, HEADS, VALUE_DIM)
    assert (delta_rule_state_patch_estimates(clean, clean, weights, use_qk_l2norm=True, chunk_size=8) == 0).all()
