"""ssd_states against transformers' own Mamba-2 kernels: the one-token update stepped along the sequence, and the
chunk scan's final state."""

import inspect
import math

import pytest
import torch
from transformers.models.mamba2 import modeling_mamba2

from nnterp import positions
from nnterp.testing.recurrent import POSITION_IDS, POSITIONS, check_positions, close_relative
from nnterp_ssd.trajectory import ssd_states

# The pure-torch bodies, past the hub dispatcher (which would pick mamba_ssm's compiled kernels if installed).
STATE_UPDATE = inspect.unwrap(modeling_mamba2.mamba2_selective_state_update)
CHUNK_SCAN = inspect.unwrap(modeling_mamba2.mamba2_chunk_scan)

BATCH, HEADS, HEAD_DIM, GROUPS, STATE_DIM = 2, 4, 8, 2, 16
SEQ = 150  # three chunks of 64, the last one partial


def inputs(seq=SEQ, with_state=True, step_shift=0.0, dtype=torch.float32, seed=0):
    """Scan arguments at the scale a trained Mamba-2 hands them: A from -1 to -16, steps from 0.001 to about 0.5."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=generator)

    x = normal(BATCH, seq, HEADS, HEAD_DIM)
    dt = 0.5 * normal(BATCH, seq, HEADS)
    # dt_bias inverts the softplus of steps log-uniform in [0.001, 0.1], as Mamba-2 initializes it
    steps = torch.exp(torch.linspace(math.log(1e-3), math.log(0.1), HEADS))
    dt_bias = steps + torch.log(-torch.expm1(-steps)) + step_shift
    A = -torch.linspace(1.0, 16.0, HEADS)
    B = normal(BATCH, seq, GROUPS, STATE_DIM)
    state = normal(BATCH, HEADS, HEAD_DIM, STATE_DIM) if with_state else None
    return x.to(dtype), dt.to(dtype), A, B.to(dtype), state, dt_bias


def token_loop_states(x, dt, A, B, state, dt_bias):
    """Every state, key side first, from transformers' one-token update applied token after token to one buffer,
    called as the mixer calls it on a decode step (dt, A and dt_bias expanded over head_dim)."""
    buffer = torch.zeros(BATCH, HEADS, HEAD_DIM, STATE_DIM) if state is None else state.clone()
    expanded_A = A[:, None, None].expand(HEADS, HEAD_DIM, STATE_DIM)
    expanded_bias = dt_bias[:, None].expand(HEADS, HEAD_DIM)
    C = torch.ones(BATCH, GROUPS, STATE_DIM, dtype=B.dtype)  # only read for the output, which is not compared
    states = []
    for t in range(x.shape[1]):
        step = dt[:, t, :, None].expand(BATCH, HEADS, HEAD_DIM)
        STATE_UPDATE(buffer, x[:, t], step, expanded_A, B[:, t], C, dt_bias=expanded_bias, dt_softplus=True)
        states.append(buffer.transpose(-1, -2).clone())
    return torch.stack(states, dim=1)


def states_of(x, dt, A, B, state, dt_bias, **options):
    return ssd_states(x, dt, A, B, state, dt_bias=dt_bias, **options)


@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "over_state"])
def test_every_state_is_the_token_loops(with_state):
    args = inputs(with_state=with_state)
    states = states_of(*args)
    assert states.shape == (BATCH, SEQ, HEADS, STATE_DIM, HEAD_DIM) and states.dtype == torch.float32
    close_relative(states, token_loop_states(*args))


def scan_final_states(x, dt, A, B, state, dt_bias, ends, **options):
    """The chunk scan's final state on each prefix ending at ``ends``, key side first."""
    finals = []
    for end in ends:
        _, final = CHUNK_SCAN(
            x[:, :end], dt[:, :end], A, B[:, :end], B[:, :end], chunk_size=8, dt_bias=dt_bias,
            initial_states=state, dt_softplus=True, return_final_states=True, **options,
        )  # fmt: skip
        finals.append(final.transpose(-1, -2))
    return torch.stack(finals, dim=1)


def test_states_are_the_chunk_scans_final_states_under_a_step_limit():
    """The scan clamps the step to dt_limit (the update does not): each state is the scan's final state on the prefix
    that ends there."""
    args = inputs(seq=40, seed=1)
    limit = (0.01, 0.05)
    states = states_of(*args, dt_limit=limit, chunk_size=16)
    close_relative(states[:, [0, 16, 39]], scan_final_states(*args, (1, 17, 40), dt_limit=limit))


def test_large_steps_and_other_chunk_sizes():
    """Steps near 5 decay a state by up to exp(-80) in one token; the chunk size changes the grouping, not the states."""
    args = inputs(step_shift=5.0, seed=2)
    expected = token_loop_states(*args)
    for chunk_size in (1, 7, 64, 256):
        close_relative(states_of(*args, chunk_size=chunk_size), expected)


def test_a_long_prompt_stays_within_tolerance():
    args = inputs(seq=1000, seed=3)
    close_relative(states_of(*args), token_loop_states(*args))


def test_a_decode_step_continues_from_the_cached_state():
    args = inputs(seq=1, seed=4)
    states = states_of(*args)
    assert states.shape == (BATCH, 1, HEADS, STATE_DIM, HEAD_DIM)
    close_relative(states, token_loop_states(*args))


def test_left_padding_leaves_a_fresh_state_empty():
    """Padding zeroes x and B (after the convolution) while dt keeps its bias: the state stays zero through the
    padding, and the real tokens' states are the unpadded row's."""
    x, dt, A, B, _, dt_bias = inputs(seed=5)
    padding = 7
    x[1, :padding] = 0
    dt[1, :padding] = 0
    B[1, :padding] = 0
    states = states_of(x, dt, A, B, None, dt_bias)
    assert not states[1, :padding].any()
    close_relative(
        states[1:, padding:], states_of(x[1:, padding:], dt[1:, padding:], A, B[1:, padding:], None, dt_bias)
    )
    close_relative(states, token_loop_states(x, dt, A, B, None, dt_bias))


@pytest.mark.parametrize("positions", POSITIONS, ids=POSITION_IDS)
def test_positions_select_as_indexing_would(positions):
    args = inputs(seed=6)
    check_positions(lambda **selection: states_of(*args, **selection), positions)


def test_blocks_bound_the_memory_not_the_states(monkeypatch):
    """One chunk per block of asked states, against all of them at once; a batch of one is computed in place."""
    args = inputs(seed=8)
    expected = states_of(*args)
    x, dt, A, B, state, dt_bias = args
    single = (x[:1], dt[:1], A, B[:1], state[:1], dt_bias)
    expected_single = states_of(*single)
    monkeypatch.setattr(positions, "BLOCK_ELEMENTS", 1)
    close_relative(states_of(*args), expected, tolerance=1e-6)
    close_relative(states_of(*single), expected_single, tolerance=1e-6)
    close_relative(states_of(*args, positions=[149, 3, 64, 3, -2]), expected[:, [149, 3, 64, 3, -2]], tolerance=1e-6)


def test_positions_outside_the_call_are_refused():
    with pytest.raises(IndexError, match="outside this call's 150 tokens"):
        states_of(*inputs(), positions=200)


def test_dtype_follows_the_kernels_inputs():
    """In bf16 the scan keeps dt * x in float32 where the one-token update rounds it, so the scan is the reference."""
    args = inputs(dtype=torch.bfloat16, seed=7)
    expected = scan_final_states(*args, range(1, SEQ + 1, 10))
    in_bf16 = states_of(*args, positions=slice(None, None, 10))
    in_float32 = states_of(*args, positions=slice(None, None, 10), dtype=torch.float32)
    assert in_bf16.dtype == torch.bfloat16 and in_float32.dtype == torch.float32
    close_relative(in_float32, expected)
    assert torch.equal(in_bf16, in_float32.to(torch.bfloat16))
