"""delta_rule_states and delta_rule_mixing against transformers' own token-by-token delta-rule kernels, one token per call."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from transformers.models.kimi_linear import modeling_kimi_linear
from transformers.models.qwen3_5 import modeling_qwen3_5

from nnterp import positions
from nnterp.analysis import mixed
from nnterp.testing.recurrent import POSITION_IDS, POSITIONS, check_positions, close_relative
from nnterp_deltanet.mixing import delta_rule_mixing
from nnterp_deltanet.trajectory import delta_rule_states

# The pure-torch bodies, past the hub dispatcher (which would pick fla's compiled kernels if installed).
GATED_DELTA_RULE = inspect.unwrap(modeling_qwen3_5.torch_recurrent_gated_delta_rule)
GATED_DELTA_RULE_CHUNKED = inspect.unwrap(modeling_qwen3_5.torch_chunk_gated_delta_rule)
KIMI_DELTA_RULE = inspect.unwrap(modeling_kimi_linear.recurrent_kimi_delta_attention)

BATCH, KEY_HEADS, HEADS, KEY_DIM, VALUE_DIM = 2, 2, 4, 16, 8
SEQ = 150  # three chunks of 64, the last one partial


def inputs(seq=SEQ, per_channel=False, beta_max=1.0, with_state=True, dtype=torch.float32, seed=0):
    """Kernel arguments at the scale a trained mixer hands them: gates from softplus'd projections, some near 0, some below -20."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=generator)

    key_heads = HEADS if per_channel else KEY_HEADS
    query, key = normal(BATCH, seq, key_heads, KEY_DIM), normal(BATCH, seq, key_heads, KEY_DIM)
    value = normal(BATCH, seq, HEADS, VALUE_DIM)
    gate_shape = (BATCH, seq, HEADS, KEY_DIM) if per_channel else (BATCH, seq, HEADS)
    decay_rate = torch.linspace(0.05, 16.0, HEADS).view(HEADS, *([1] * (len(gate_shape) - 3)))
    g = -decay_rate * F.softplus(normal(*gate_shape) - 2.0)
    beta = beta_max * torch.sigmoid(normal(BATCH, seq, HEADS))
    state = normal(BATCH, HEADS, KEY_DIM, VALUE_DIM) if with_state else None
    cast = [t.to(dtype) for t in (query, key, value)]
    return (*cast, g, beta.to(dtype), state)


def token_loop(query, key, value, g, beta, state, per_channel=False):
    """Every state and output, from transformers' recurrent kernel called once per token with the previous token's state."""
    kernel = KIMI_DELTA_RULE if per_channel else GATED_DELTA_RULE
    # queries and keys repeated to the value heads: the kernel then skips its own repeat (5.23+), and 5.17 needs it
    repeat = value.shape[2] // key.shape[2]
    query, key = query.repeat_interleave(repeat, dim=2), key.repeat_interleave(repeat, dim=2)
    states, outputs = [], []
    for t in range(query.shape[1]):
        token = slice(t, t + 1)
        output, state = kernel(
            query[:, token],
            key[:, token],
            value[:, token],
            g=g[:, token],
            beta=beta[:, token],
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        states.append(state)
        outputs.append(output)
    return torch.stack(states, dim=1), torch.cat(outputs, dim=1)


def token_loop_states(*args, per_channel=False):
    """Every state, from transformers' recurrent kernel called once per token (``token_loop``)."""
    return token_loop(*args, per_channel=per_channel)[0]


@pytest.mark.parametrize("per_channel", [False, True], ids=["gated_deltanet", "kimi_kda"])
@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "over_state"])
def test_every_state_is_the_token_loops(per_channel, with_state):
    args = inputs(per_channel=per_channel, with_state=with_state)
    expected = token_loop_states(*args, per_channel=per_channel)
    states = delta_rule_states(*args)
    assert states.shape == (BATCH, SEQ, HEADS, KEY_DIM, VALUE_DIM) and states.dtype == torch.float32
    close_relative(states, expected)


def test_last_state_is_the_chunked_kernels_final_state():
    query, key, value, g, beta, state = inputs(seq=200)
    repeat = HEADS // KEY_HEADS
    _, final = GATED_DELTA_RULE_CHUNKED(
        query.repeat_interleave(repeat, dim=2),
        key.repeat_interleave(repeat, dim=2),
        value,
        g=g,
        beta=beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    close_relative(delta_rule_states(query, key, value, g, beta, state, positions=-1), final)


def test_betas_up_to_two_and_other_chunk_sizes():
    """OLMo-Hybrid's betas reach 2 (a negative eigenvalue); the chunk size changes the grouping, not the states."""
    args = inputs(beta_max=2.0, seed=1)
    expected = token_loop_states(*args)
    for chunk_size in (1, 16, 64, 256):
        close_relative(delta_rule_states(*args, chunk_size=chunk_size), expected)


def test_a_long_prompt_stays_within_tolerance():
    args = inputs(seq=1000, seed=2)
    close_relative(delta_rule_states(*args), token_loop_states(*args))


def test_a_decode_step_continues_from_the_cached_state():
    query, key, value, g, beta, state = inputs(seq=1, seed=3)
    states = delta_rule_states(query, key, value, g, beta, state)
    assert states.shape == (BATCH, 1, HEADS, KEY_DIM, VALUE_DIM)
    close_relative(states, token_loop_states(query, key, value, g, beta, state))


def test_left_padding_leaves_a_fresh_state_empty():
    """Padding zeroes a token's hidden state, so its query, key and value are zero and its beta and gate come from
    biases: the state stays zero through the padding and the real tokens' states are the unpadded row's."""
    query, key, value, g, beta, _ = inputs(seed=4)
    padding = 7
    for tensor in (query, key, value):
        tensor[1, :padding] = 0
    beta[1, :padding] = 0.5
    states = delta_rule_states(query, key, value, g, beta)
    assert not states[1, :padding].any()
    row = (t[1:, padding:] for t in (query, key, value, g, beta))
    close_relative(states[1:, padding:], delta_rule_states(*row))
    close_relative(states, token_loop_states(query, key, value, g, beta, None))


@pytest.mark.parametrize("positions", POSITIONS, ids=POSITION_IDS)
def test_positions_select_as_indexing_would(positions):
    args = inputs(seed=5)
    check_positions(lambda **selection: delta_rule_states(*args, **selection), positions)


def test_blocks_bound_the_memory_not_the_states(monkeypatch):
    """One chunk per block of asked states, against all of them at once; a batch of one is computed in place."""
    args = inputs(seed=8)
    expected = delta_rule_states(*args)
    single = tuple(tensor[:1] for tensor in args)  # every argument has the batch axis first
    expected_single = delta_rule_states(*single)
    monkeypatch.setattr(positions, "BLOCK_ELEMENTS", 1)
    close_relative(delta_rule_states(*args), expected, tolerance=1e-6)
    close_relative(delta_rule_states(*single), expected_single, tolerance=1e-6)
    close_relative(
        delta_rule_states(*args, positions=[149, 3, 64, 3, -2]), expected[:, [149, 3, 64, 3, -2]], tolerance=1e-6
    )


def test_positions_outside_the_call_are_refused():
    with pytest.raises(IndexError, match="outside this call's 150 tokens"):
        delta_rule_states(*inputs(), positions=[3, 150])


def test_dtype_follows_the_kernels_inputs():
    args = inputs(dtype=torch.bfloat16, seed=6)
    expected = token_loop_states(*args)
    in_bf16 = delta_rule_states(*args, positions=slice(None, None, 10))
    in_float32 = delta_rule_states(*args, positions=slice(None, None, 10), dtype=torch.float32)
    assert in_bf16.dtype == torch.bfloat16 and in_float32.dtype == torch.float32
    close_relative(in_float32, expected[:, ::10])
    assert torch.equal(in_bf16, in_float32.to(torch.bfloat16))


def mixing(args, rows=None, heads=None, chunk_size=64):
    query, key, value, g, beta, state = args
    rows = torch.arange(query.shape[1]) if rows is None else rows
    heads = torch.arange(HEADS) if heads is None else heads
    return delta_rule_mixing(query, key, value, g, beta, state, rows, heads, use_qk_l2norm=True, chunk_size=chunk_size)


@pytest.mark.parametrize("per_channel", [False, True], ids=["gated_deltanet", "kimi_kda"])
@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "over_state"])
def test_token_mixing_rebuilds_the_token_loops_outputs(per_channel, with_state):
    """Three chunks (the last partial) over a state: every row reads earlier chunks through their carries."""
    args = inputs(per_channel=per_channel, with_state=with_state, beta_max=2.0, seed=9)
    _, outputs = token_loop(*args, per_channel=per_channel)
    matrix, offset = mixing(args)
    assert matrix.shape == (BATCH, HEADS, SEQ, SEQ) and offset.shape == outputs.shape
    close_relative(mixed(matrix, args[2]) + offset, outputs)
    assert with_state or not offset.any(), "a call from zeros has nothing but its values to read"


def test_token_mixing_is_the_product_of_the_token_transitions():
    """M[t, j] = beta_j q_t^T A_t ... A_{j+1} k_j with A_i = (I - beta_i k_i k_i^T) exp(g_i), the key removal kept."""
    seq = 20
    query, key, value, g, beta, _ = inputs(seq=seq, per_channel=True, seed=10)
    matrix, _ = mixing((query, key, value, g, beta, None), chunk_size=8)
    head, rows = 1, []
    q = F.normalize(query[0, :, head], dim=-1, eps=1e-6) * KEY_DIM**-0.5
    k = F.normalize(key[0, :, head], dim=-1, eps=1e-6)
    for t in range(seq):
        reading, row = q[t], []
        for j in range(t, -1, -1):
            row.append(beta[0, j, head] * reading @ k[j])
            # one transition further back: the row vector times A_j
            reading = (reading - beta[0, j, head] * (reading @ k[j]) * k[j]) * g[0, j, head].exp()
        rows.append(torch.stack(row[::-1] + [torch.tensor(0.0)] * (seq - t - 1)))
    close_relative(matrix[0, head], torch.stack(rows))


def test_token_mixing_rows_and_heads_are_slices_of_the_whole():
    args = inputs(seed=11)
    matrix, offset = mixing(args)
    rows, heads = torch.tensor([0, 63, 64, 149]), torch.tensor([3, 1])
    part, part_offset = mixing(args, rows=rows, heads=heads)
    close_relative(part, matrix[:, heads][:, :, rows], tolerance=1e-6)
    close_relative(part_offset, offset[:, rows][:, :, heads], tolerance=1e-6)
