"""token_mixing of a Mamba-2 mixer against a token loop over its served values, and ssd_mixing against the kernel on a
long call."""

import inspect
import math

import pytest
import torch
from transformers.models.mamba2 import modeling_mamba2

from nnterp.analysis.mixing import mixed
from nnterp.testing import PROMPT, blocks_with, tiny_standardized
from nnterp.testing.recurrent import close_relative
from nnterp_ssd.mixing import ssd_mixing
from nnterp_ssd.testing import ARGUMENT_VALUES, per_head

# The pure-torch body, past the hub dispatcher (which would pick mamba_ssm's compiled kernel if installed).
CHUNK_SCAN = inspect.unwrap(modeling_mamba2.mamba2_chunk_scan)

TOLERANCE = 1e-5


def token_loop_mixing(values: dict[str, torch.Tensor], skip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(matrix, offset) of one call, one token at a time, from its served values.

    Each earlier token's weight in the current row is its step ``betas_j``
    times every later token's ``exp(decays)`` multiplied in as the loop
    passes it; the row is that weight times ``C_t . B_j``. The state the call
    started from (``state_input``, ``[batch, heads, state_dim, head_dim]``)
    decays the same way and is read by ``C_t``; ``D x_t`` is added.
    """
    x, queries, keys, betas, decays = per_head(values)
    batch, seq, heads, head_dim = x.shape
    start = values["state_input"]
    start = torch.zeros(batch, heads, keys.shape[-1], head_dim) if start is None else start.float()
    matrix = torch.zeros(batch, heads, seq, seq)
    weights = torch.zeros(batch, heads, seq)
    offsets = []
    for t in range(seq):
        kept = torch.exp(decays[:, t])
        weights = weights * kept[..., None]
        weights[:, :, t] = betas[:, t]  # later tokens' weights stay zero until the loop reaches them
        matrix[:, :, t] = weights * torch.einsum("bhn,bjhn->bhj", queries[:, t], keys)
        start = kept[..., None, None] * start
        offsets.append(torch.einsum("bhnp,bhn->bhp", start, queries[:, t]) + skip[:, None] * x[:, t])
    return matrix, torch.stack(offsets, dim=1)


def read_call(mixer, **assigned):
    """Inside a trace: the call's served values (after ``assigned`` is written), its token mixing and its offset."""
    for name, value in assigned.items():
        setattr(mixer, name, value)
    values = {name: getattr(mixer, name) for name in ARGUMENT_VALUES}
    values = {name: None if value is None else value.save() for name, value in values.items()}
    return values, mixer.token_mixing().save(), mixer.mixing_offset().save()


def check_against_token_loop(mixer, read, what: str) -> None:
    values, matrix, offset = read
    expected_matrix, expected_offset = token_loop_mixing(values, mixer._module.D.detach().float())
    close_relative(matrix, expected_matrix, f"{what}: token_mixing vs the token loop", TOLERANCE)
    close_relative(offset, expected_offset, f"{what}: mixing_offset vs the token loop", TOLERANCE)


# Every family: on the tiny models D x dominates the head outputs (C . B is small), so on some of them the suites'
# rebuilding of y hardly sees the matrix, which this compares entry by entry.
@pytest.mark.parametrize("family", ["mamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "zamba2"])
def test_token_mixing_matches_a_token_loop_over_the_served_values(family: str) -> None:
    """On a prompt started from an assigned state and on decode steps, whose offset reads the cached state."""
    torch.manual_seed(0)
    model = tiny_standardized(family)
    mixer = model.layers[blocks_with(model, "linear_attn")[-1]].linear_attn
    start = torch.randn(1, mixer.mixer_heads, mixer.state_dim, mixer.head_dim)
    prompt = []  # filled inside the trace: a name bound there is not carried out of it
    with model.trace(PROMPT):
        prompt.append(read_call(mixer, state_input=start))
    check_against_token_loop(mixer, prompt[0], "a prompt from an assigned state")

    steps = []
    with model.generate(PROMPT, max_new_tokens=3, do_sample=False) as tracer:
        for _ in tracer.iter[:3]:
            steps.append(read_call(mixer))
    assert len(steps) == 3
    for step, read in enumerate(steps[1:], start=1):
        assert read[0]["state_input"] is not None and read[1].shape[-2:] == (1, 1)
        check_against_token_loop(mixer, read, f"decode step {step}")


def long_call(generator: torch.Generator, batch: int) -> tuple[torch.Tensor, ...]:
    """A Mamba-2 scan call of 2048 tokens, 4 heads of 8 in 2 groups, state 16: (x, dt, A, B, C, D, dt_bias).

    Steps log-uniform in [0.001, 0.1] and A from -1 to -16, as Mamba-2 initializes them: the rows' decays sum to
    hundreds.
    """

    def normal(*shape):
        return torch.randn(*shape, generator=generator)

    seq, heads, head_dim, groups, state_dim = 2048, 4, 8, 2, 16
    steps = torch.exp(torch.linspace(math.log(1e-3), math.log(0.1), heads))
    dt_bias = steps + torch.log(-torch.expm1(-steps))
    A = -torch.linspace(1.0, 16.0, heads)
    x, dt = normal(batch, seq, heads, head_dim), 0.5 * normal(batch, seq, heads)
    B, C, D = normal(batch, seq, groups, state_dim), normal(batch, seq, groups, state_dim), normal(heads)
    return x, dt, A, B, C, D, dt_bias


def test_long_calls_keep_float32_precision() -> None:
    """Thousands of tokens: the rows' decays sum to hundreds, yet y is rebuilt to float32 rounding.

    A decay taken as the difference of two running sums from the call's start
    is off by about 2e-5 here.
    """
    generator = torch.Generator().manual_seed(0)
    x, dt, A, B, C, D, dt_bias = long_call(generator, batch=2)
    batch, seq, heads, head_dim = x.shape
    start = torch.randn(batch, heads, head_dim, B.shape[-1], generator=generator)
    y = CHUNK_SCAN(x, dt, A, B, C, 64, D=D, dt_bias=dt_bias, initial_states=start, dt_softplus=True)

    rows, chosen = torch.arange(seq - 64, seq), torch.tensor([3, 0])
    matrix, offset = ssd_mixing(x, dt, A, B, C, rows, chosen, D=D, initial_state=start, dt_bias=dt_bias)
    assert matrix.shape == (batch, 2, 64, seq) and offset.shape == (batch, 64, 2, head_dim)
    close_relative(mixed(matrix, x[:, :, chosen]) + offset, y[:, rows][:, :, chosen], "the last 64 rows", TOLERANCE)


def test_the_whole_matrix_of_a_long_call_in_any_row_order_keeps_float32_precision() -> None:
    """Every row of 2048 tokens, asked in shuffled order, against the kernel in float64: the rows are computed in
    blocks a window of tokens apart, whose running sums stay short (one block of every row is off by about 1e-5)."""
    generator = torch.Generator().manual_seed(0)
    x, dt, A, B, C, D, dt_bias = long_call(generator, batch=1)
    seq, heads = x.shape[1:3]
    exact = CHUNK_SCAN(
        *(t.double() for t in (x, dt, A, B, C)), 64, D=D.double(), dt_bias=dt_bias.double(), dt_softplus=True
    )
    rows = torch.randperm(seq, generator=generator)
    matrix, offset = ssd_mixing(x, dt, A, B, C, rows, torch.arange(heads), D=D, dt_bias=dt_bias)
    error = (mixed(matrix, x) + offset).double() - exact[:, rows]
    assert error.abs().max() <= 1e-6 * exact.abs().max(), f"off by {error.abs().max() / exact.abs().max():.1e}"
