"""selective_scan_states against transformers' own Mamba-1 kernels: the one-token update stepped along the sequence."""

import inspect
import math

import pytest
import torch
from transformers.models.mamba import modeling_mamba

from nnterp.testing.recurrent import POSITION_IDS, POSITIONS, check_positions, close_relative
from nnterp_mamba import trajectory
from nnterp_mamba.trajectory import (
    entering_contribution,
    gated,
    selective_scan_head_outputs,
    selective_scan_states,
)

# The pure-torch bodies, past the hub dispatcher (which would pick mamba_ssm's compiled kernels if installed).
STATE_UPDATE = inspect.unwrap(modeling_mamba.mamba_selective_state_update)
SCAN = inspect.unwrap(modeling_mamba.mamba_selective_scan)

BATCH, CHANNELS, STATE_DIM = 2, 24, 16
SEQ = 150  # three chunks of 64, the last one partial


def inputs(seq=SEQ, with_state=True, step_shift=0.0, dtype=torch.float32, seed=0):
    """Scan arguments at the scale a trained Mamba hands them: S4D-real A, steps from 0.001 to about 0.5."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=generator)

    x = normal(BATCH, CHANNELS, seq)
    dt = 0.5 * normal(BATCH, CHANNELS, seq)
    # dt_proj's bias inverts the softplus of steps log-uniform in [0.001, 0.1], as Mamba initializes it
    steps = torch.exp(torch.linspace(math.log(1e-3), math.log(0.1), CHANNELS))
    dt_bias = steps + torch.log(-torch.expm1(-steps)) + step_shift
    A = -torch.arange(1, STATE_DIM + 1, dtype=torch.float32).expand(CHANNELS, STATE_DIM).contiguous()
    B = normal(BATCH, STATE_DIM, seq)
    state = normal(BATCH, CHANNELS, STATE_DIM) if with_state else None
    return x.to(dtype), dt.to(dtype), A, B.to(dtype), state, dt_bias


def token_loop_states(x, dt, A, B, state, dt_bias):
    """Every state, from transformers' one-token update applied token after token to one state buffer."""
    buffer = torch.zeros(BATCH, CHANNELS, STATE_DIM) if state is None else state.clone()
    C = torch.ones(BATCH, STATE_DIM, dtype=B.dtype)  # only read for the output, which is not compared
    states = []
    for t in range(x.shape[-1]):
        STATE_UPDATE(buffer, x[..., t], dt[..., t], A, B[..., t], C, dt_bias=dt_bias, dt_softplus=True)
        states.append(buffer.clone())
    return torch.stack(states, dim=1)


def states_of(x, dt, A, B, state, dt_bias, **options):
    return selective_scan_states(x, dt, A, B, state, dt_bias=dt_bias, **options)


@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "over_state"])
def test_every_state_is_the_token_loops(with_state):
    args = inputs(with_state=with_state)
    states = states_of(*args)
    assert states.shape == (BATCH, SEQ, CHANNELS, STATE_DIM) and states.dtype == torch.float32
    close_relative(states, token_loop_states(*args))


def test_last_state_is_the_scans_returned_state():
    x, dt, A, B, _, dt_bias = inputs(seq=200)
    _, final = SCAN(x, dt, A, B, B, delta_bias=dt_bias, delta_softplus=True, return_last_state=True)
    close_relative(states_of(x, dt, A, B, None, dt_bias, positions=-1), final)


def test_large_steps_and_other_chunk_sizes():
    """Steps near 5 decay a state by up to exp(-80) in one token; the chunk size changes the grouping, not the states."""
    args = inputs(step_shift=5.0, seed=1)
    expected = token_loop_states(*args)
    for chunk_size in (1, 7, 64, 256):
        close_relative(states_of(*args, chunk_size=chunk_size), expected)


def test_a_long_prompt_stays_within_tolerance():
    args = inputs(seq=1000, seed=2)
    close_relative(states_of(*args), token_loop_states(*args))


def test_a_decode_step_continues_from_the_cached_state():
    args = inputs(seq=1, seed=3)
    states = states_of(*args)
    assert states.shape == (BATCH, 1, CHANNELS, STATE_DIM)
    close_relative(states, token_loop_states(*args))


def test_left_padding_leaves_a_fresh_state_empty():
    """Padding zeroes x (after the convolution and activation) while dt keeps its bias: the state stays zero through
    the padding, and the real tokens' states are the unpadded row's."""
    x, dt, A, B, _, dt_bias = inputs(seed=4)
    padding = 7
    x[1, :, :padding] = 0
    dt[1, :, :padding] = 0
    B[1, :, :padding] = 0
    states = states_of(x, dt, A, B, None, dt_bias)
    assert not states[1, :padding].any()
    close_relative(
        states[1:, padding:], states_of(x[1:, :, padding:], dt[1:, :, padding:], A, B[1:, :, padding:], None, dt_bias)
    )
    close_relative(states, token_loop_states(x, dt, A, B, None, dt_bias))


@pytest.mark.parametrize("positions", POSITIONS, ids=POSITION_IDS)
def test_positions_select_as_indexing_would(positions):
    args = inputs(seed=5)
    check_positions(lambda **selection: states_of(*args, **selection), positions)


def test_positions_outside_the_call_are_refused():
    with pytest.raises(IndexError, match="outside this call's 150 tokens"):
        states_of(*inputs(), positions=[3, -151])


def test_dtype_follows_the_kernels_inputs():
    args = inputs(dtype=torch.bfloat16, seed=6)
    expected = token_loop_states(*args)
    in_bf16 = states_of(*args, positions=slice(None, None, 10))
    in_float32 = states_of(*args, positions=slice(None, None, 10), dtype=torch.float32)
    assert in_bf16.dtype == torch.bfloat16 and in_float32.dtype == torch.float32
    close_relative(in_float32, expected[:, ::10])
    assert torch.equal(in_bf16, in_float32.to(torch.bfloat16))


def test_entering_contribution_is_the_decayed_states_readout_and_its_gradient():
    """What entering a scan with a state adds, in 16-token blocks computed in place, is ``C_t . exp(A * (dt_1 + ...
    + dt_t)) h`` at each token and the state decayed over the call, and it carries the same gradient."""
    generator = torch.Generator().manual_seed(0)
    dt = torch.randn(2, 8, 40, generator=generator).requires_grad_()
    A = (-torch.rand(8, 4, generator=generator) * 4).requires_grad_()
    C = torch.randn(2, 4, 40, generator=generator).requires_grad_()
    state = torch.randn(2, 8, 4, generator=generator).requires_grad_()
    outputs, final = entering_contribution(dt, A, C, state)
    elapsed = torch.nn.functional.softplus(dt).cumsum(-1)  # [batch, channels, seq]
    decayed = torch.exp(elapsed[..., None] * A[:, None, :]) * state[:, :, None, :]  # [batch, channels, seq, n]
    expected = (decayed * C.transpose(1, 2)[:, None]).sum(-1), decayed[:, :, -1]
    torch.testing.assert_close((outputs, final), expected)
    weights = torch.randn(outputs.shape, generator=generator), torch.randn(final.shape, generator=generator)
    arguments = (dt, A, C, state)
    got = torch.autograd.grad([outputs, final], arguments, weights)
    wanted = torch.autograd.grad(list(expected), arguments, weights)
    for name, ours, reference in zip(("dt", "A", "C", "state"), got, wanted, strict=True):
        torch.testing.assert_close(ours, reference, msg=f"the gradient of {name}")


def token_loop_outputs(x, dt, A, B, C, D, z, state, dt_bias):
    """The gated outputs and the last state of transformers' one-token update applied token after token."""
    buffer = torch.zeros(BATCH, CHANNELS, STATE_DIM) if state is None else state.clone()
    outputs = [
        STATE_UPDATE(
            buffer, x[..., t], dt[..., t], A, B[..., t], C[..., t], D, z=z[..., t], dt_bias=dt_bias, dt_softplus=True
        )
        for t in range(x.shape[-1])
    ]
    return torch.stack(outputs, dim=-1), buffer


@pytest.mark.parametrize("block_bytes", [BATCH * CHANNELS * STATE_DIM * 4 * 7, trajectory.BLOCK_BYTES])
@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "over_state"])
def test_scan_outputs_are_the_kernels_gated_outputs_and_last_state(with_state, block_bytes, monkeypatch):
    """In blocks of 7 tokens or in one, from zeros as the kernel starts or continuing from a state as a decode step
    does: the head outputs gated are the kernel's own loop's outputs from zeros, and transformers' one-token update's
    token after token."""
    monkeypatch.setattr(trajectory, "BLOCK_BYTES", block_bytes)
    x, dt, A, B, state, dt_bias = inputs(with_state=with_state, seed=7)
    generator = torch.Generator().manual_seed(8)
    C, z = torch.randn(B.shape, generator=generator), torch.randn(x.shape, generator=generator)
    D = torch.randn(CHANNELS, generator=generator)
    head_outputs, last = selective_scan_head_outputs(x, dt, A, B, C, D, state, dt_bias=dt_bias, softplus=True)
    outputs = gated(head_outputs, z)
    assert outputs.shape == x.shape and last.shape == (BATCH, CHANNELS, STATE_DIM)
    expected_outputs, expected_last = token_loop_outputs(x, dt, A, B, C, D, z, state, dt_bias)
    close_relative(outputs, expected_outputs)
    close_relative(last, expected_last)
    if state is None:
        kernels = SCAN(x, dt, A, B, C, D, z=z, delta_bias=dt_bias, delta_softplus=True, return_last_state=True)
        close_relative(outputs, kernels[0])
        close_relative(last, kernels[1])


def test_a_float64_scans_head_outputs_are_the_float64_kernels():
    """In a float64 model the kernel computes in float64, and so do the head outputs: equal to its loop far past float32's
    rounding."""
    x, dt, A, B, _, dt_bias = inputs(with_state=False, dtype=torch.float64, seed=9)
    A, dt_bias = A.double(), dt_bias.double()
    generator = torch.Generator().manual_seed(10)
    C, D = torch.randn(B.shape, generator=generator).double(), torch.randn(CHANNELS, generator=generator).double()
    head_outputs, last = selective_scan_head_outputs(x, dt, A, B, C, D, dt_bias=dt_bias, softplus=True)
    assert head_outputs.dtype == last.dtype == torch.float64
    kernels = SCAN(x, dt, A, B, C, D, delta_bias=dt_bias, delta_softplus=True, return_last_state=True)
    torch.testing.assert_close((head_outputs, last), kernels, rtol=1e-12, atol=1e-12)
