"""The Mamba-2 state patch estimate in chunks, against the adjoint times the difference of the states written out."""

import pytest
import torch

from nnterp_ssd.gradients import ScanRun, ssd_state_gradients, ssd_state_patch_estimates

BATCH, HEADS, GROUPS, STATE_DIM, HEAD_DIM = 2, 4, 2, 3, 5


def run(seq: int, seed: int) -> ScanRun:
    """A scan call's decays (mild to strong), keys, queries, writes and a non-zero entering state."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    log_decay = -torch.rand(BATCH, seq, HEADS, generator=generator, dtype=torch.float64) * 1.5
    return ScanRun(
        log_decay,
        normal(BATCH, seq, GROUPS, STATE_DIM),
        normal(BATCH, seq, GROUPS, STATE_DIM),
        normal(BATCH, seq, HEADS, HEAD_DIM),
        normal(BATCH, HEADS, STATE_DIM, HEAD_DIM),
    )


def states(scan: ScanRun) -> torch.Tensor:
    """h_t = exp(dt_t A) h_{t-1} + B_t (dt_t x_t)^T from the entering state, token by token: [batch, seq, heads, n, p]."""
    keys = scan.B.repeat_interleave(HEADS // GROUPS, dim=2)
    state, every = scan.entering, []
    for t in range(scan.log_decay.shape[1]):
        state = scan.log_decay[:, t, :, None, None].exp() * state + keys[:, t, :, :, None] * scan.written[:, t, :, None]
        every.append(state)
    return torch.stack(every, dim=1)


@pytest.mark.parametrize("seq, chunk_size", [(11, 4), (12, 4), (11, 64), (30, 7), (1, 3)])
def test_the_chunked_estimate_is_the_state_patch_times_the_adjoint(seq, chunk_size):
    """Every pair of a write before a token and a read after it, in its own chunk or across chunks, with the
    entering states of both runs and a partial last chunk."""
    clean, corrupt = run(seq, 0), run(seq, 1)
    gradients = torch.randn(
        BATCH, seq, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )
    adjoint = ssd_state_gradients(clean.log_decay, clean.C, gradients).double()
    expected = ((states(corrupt) - states(clean)) * adjoint).sum((-2, -1))
    found = ssd_state_patch_estimates(clean, corrupt, gradients, chunk_size=chunk_size)
    assert found.shape == (BATCH, seq, HEADS) and found.dtype == torch.float32
    torch.testing.assert_close(found.double(), expected, rtol=1e-4, atol=1e-5)


def test_a_run_against_itself_estimates_nothing():
    clean = run(20, 0)
    gradients = torch.randn(BATCH, 20, HEADS, HEAD_DIM, dtype=torch.float64)
    assert (ssd_state_patch_estimates(clean, clean, gradients, chunk_size=8) == 0).all()
