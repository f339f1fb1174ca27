"""A Mamba-1 scan's token mixing against references that share none of its blocked computation.

On the mamba family: a token loop over the served C, B, betas and decays, which carries every
earlier token's write forward one token at a time. On the function itself: transformers' own
one-token update, stepped along sequences long enough for many blocks of columns and chunks of rows.
"""

import inspect

import pytest
import torch
from transformers.models.mamba import modeling_mamba

from nnterp.analysis.mixing import mixed
from nnterp.testing import PROMPT, close_relative, tiny_standardized
from nnterp_mamba import mixing
from nnterp_mamba.mixing import selective_scan_mixing

# The pure-torch body, past the hub dispatcher (which would pick mamba_ssm's compiled kernel if installed).
STATE_UPDATE = inspect.unwrap(modeling_mamba.mamba_selective_state_update)
LONG_PROMPT = " ".join([PROMPT] * 3)
BATCH, CHANNELS, STATE_DIM, SEQ = 2, 24, 16, 40


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 columns and temporaries of 4 KiB: many blocks, row chunks and channel blocks on small inputs."""
    monkeypatch.setattr(mixing, "BLOCK", 4)
    monkeypatch.setattr(mixing, "TEMPORARY_BYTES", 4096)


def token_loop_mixing(C, B, betas, decays, D, x, state=None):
    """The matrix [batch, channels, seq, seq] and offset [batch, seq, channels] of served values, token by token.

    ``written[:, j]`` is what token j's write (with x_j = 1) holds at the current token, per
    channel and state entry; each token decays every earlier write and adds its own. The
    entering ``state`` decays alongside and is read out into the offset with ``D * x``.
    """
    batch, seq, channels = x.shape
    written = torch.zeros(batch, seq, channels, decays.shape[-1])
    entering = torch.zeros(batch, channels, decays.shape[-1]) if state is None else state.float()
    matrix = torch.zeros(batch, channels, seq, seq)
    offset = torch.zeros(batch, seq, channels)
    for t in range(seq):
        decay = torch.exp(decays[:, t].float())
        written = written * decay[:, None]
        written[:, t] = betas[:, t, :, None].float() * B[:, t].float()
        entering = entering * decay
        query = C[:, t].float()  # [batch, 1, state_dim], shared by every channel
        matrix[:, :, t] = (written * query[:, None]).sum(-1).transpose(1, 2)
        offset[:, t] = (entering * query).sum(-1) + D.float() * x[:, t].float()
    return matrix, offset


def test_token_mixing_is_the_token_loop_of_the_served_values(small_blocks):
    """A prompt and two decode steps: the matrix and the offset, each on its own, are the token loop's."""
    model = tiny_standardized("mamba")
    mixer = model.layers[1].linear_attn
    read = []
    with model.generate(LONG_PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
        for step in tracer.iter[:3]:
            served = {
                "state": None if step == 0 else mixer.state_input.save(),
                "x": mixer.attention_values.save(),
                "C": mixer.attention_queries.save(),
                "B": mixer.attention_keys.save(),
                "betas": mixer.betas.save(),
                "decays": mixer.decays.save(),
                "matrix": mixer.token_mixing().save(),
                "offset": mixer.mixing_offset().save(),
                "outputs": mixer.attention_head_outputs.save(),
            }
            read.append(served)
    D = mixer._module.D.detach()
    assert read[0]["x"].shape[1] > 3 * mixing.BLOCK, "the prompt spans a few blocks of columns"
    for step, served in enumerate(read):
        matrix, offset = token_loop_mixing(
            served["C"], served["B"], served["betas"], served["decays"], D, served["x"], served["state"]
        )
        close_relative(served["matrix"], matrix, f"step {step}: token_mixing vs the token loop", 1e-5)
        close_relative(served["offset"], offset, f"step {step}: mixing_offset vs the token loop", 1e-5)
        close_relative(
            mixed(matrix, served["x"].float()) + offset, served["outputs"], f"step {step}: the loop rebuilds y", 1e-5
        )
    assert read[0]["state"] is None and read[1]["matrix"].shape[-2:] == (1, 1)
    assert read[1]["state"].abs().max() > 0, "the decode step's entering state is empty: its offset reads nothing"


def scan_arguments(with_state):
    """Arguments at the scale a trained Mamba hands its scan: S4D-real A, steps from about 0.001 to a few."""
    generator = torch.Generator().manual_seed(7)

    def normal(*shape):
        return torch.randn(*shape, generator=generator)

    x, dt, B, C = (
        normal(BATCH, CHANNELS, SEQ),
        normal(BATCH, CHANNELS, SEQ),
        normal(BATCH, STATE_DIM, SEQ),
        normal(BATCH, STATE_DIM, SEQ),
    )
    A = -torch.arange(1, STATE_DIM + 1, dtype=torch.float32).expand(CHANNELS, STATE_DIM).contiguous()
    dt_bias = torch.linspace(-7, 1, CHANNELS)  # softplus: steps from 0.001 to 1.3 before dt spreads them
    D = torch.linspace(-1, 1, CHANNELS)
    state = normal(BATCH, CHANNELS, STATE_DIM) if with_state else None
    return x, dt, A, B, C, D, state, dt_bias


def kernel_outputs(x, dt, A, B, C, D, state, dt_bias):
    """y = C . h + D x at every token, [batch, seq, channels], from transformers' one-token update stepped along."""
    buffer = torch.zeros(BATCH, CHANNELS, STATE_DIM) if state is None else state.clone()
    return torch.stack(
        [
            STATE_UPDATE(buffer, x[..., t], dt[..., t], A, B[..., t], C[..., t], D, dt_bias=dt_bias, dt_softplus=True)
            for t in range(SEQ)
        ],
        dim=1,
    )


@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "over_state"])
def test_mixing_rebuilds_the_kernels_outputs_over_many_blocks(small_blocks, with_state):
    x, dt, A, B, C, D, state, dt_bias = scan_arguments(with_state)
    expected = kernel_outputs(x, dt, A, B, C, D, state, dt_bias)
    rows, channels = torch.tensor([0, 3, 4, 5, 17, 30, 31]), torch.tensor([5, 0, 23, 11])
    matrix, offset = selective_scan_mixing(x, dt, A, B, C, D, state, rows, channels, dt_bias=dt_bias)
    assert matrix.shape == (BATCH, len(channels), len(rows), SEQ) and offset.shape == (BATCH, len(rows), len(channels))
    assert not matrix[..., 32:].any(), "a row mixes a token after it"
    rebuilt = mixed(matrix, x.transpose(1, 2)[..., channels]) + offset
    close_relative(rebuilt, expected[:, rows][..., channels], "mixed(M, x) + offset vs the kernel's y", 1e-5)


def test_blocks_of_channels_and_columns_give_the_unblocked_matrix(monkeypatch):
    """Every channel in its own block, columns in blocks of 4, against all channels in one and blocks of 8: the same."""
    x, dt, A, B, C, D, state, dt_bias = scan_arguments(True)
    rows, channels = torch.tensor([2, 9, 10, 21, 38]), torch.arange(CHANNELS)
    whole = selective_scan_mixing(x, dt, A, B, C, D, state, rows, channels, dt_bias=dt_bias)
    monkeypatch.setattr(mixing, "BLOCK", 4)
    monkeypatch.setattr(mixing, "TEMPORARY_BYTES", 1)
    assert mixing._blocks(CHANNELS, mixing._bytes_per_channel(BATCH, STATE_DIM, SEQ, rows)).__next__() == slice(0, 1)
    blocked = selective_scan_mixing(x, dt, A, B, C, D, state, rows, channels, dt_bias=dt_bias)
    close_relative(blocked.matrix, whole.matrix, "the matrix in blocks vs in one", 1e-6)
    close_relative(blocked.offset, whole.offset, "the offset in blocks vs in one", 1e-6)
