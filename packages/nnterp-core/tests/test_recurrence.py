"""nnterp.recurrence: a toy recurrence declared as a ChunkedRecurrence gives the states a plain token loop does."""

import pytest
import torch

from nnterp.recurrence import ChunkedRecurrence

BATCH, SEQ, WIDTH, CHUNK = 2, 50, 3, 8


class Decaying(ChunkedRecurrence):
    """``h_t = a_t h_{t-1} + b_t`` per element, ``a = exp(log_a)``: each token's write ``b_t`` is its own.

    ``log_a`` and ``b`` are ``[batch, seq, width]``; a padding token's zero log decay and write leave the state as
    it is. The carry steps through the chunk token by token, the steps one token of each asked chunk.
    """

    def __init__(self, log_a, b, initial_state, dtype=torch.float32) -> None:
        batch, seq_len, width = b.shape
        super().__init__(seq_len, (batch, width), initial_state, CHUNK, dtype, b.device)
        self.log_a, self.b = log_a, b

    def lay_out(self, end: int) -> None:
        self.a = self.in_chunks(self.log_a[:, :end], 1).exp()  # [batch, chunks, chunk, width]
        self.written = self.in_chunks(self.b[:, :end], 1)

    def carry(self, start, chunk, writes):
        state = start
        for offset in range(CHUNK):
            state = self.a[:, chunk, offset] * state + self.written[:, chunk, offset]
        return state

    def steps(self, asked, writes):
        a, written = self.a[:, asked], self.written[:, asked]

        def advance(running, chunks, step):
            running.mul_(a[:, chunks, step]).add_(written[:, chunks, step])

        return advance


class Correcting(Decaying):
    """The same recurrence as ``h_t = h_{t-1} + d_t``, ``d_t = (a_t - 1) h_{t-1} + b_t``: what each token writes
    depends on the state the chunk starts from, as the delta rule's corrections do."""

    def writes(self, start, chunk):
        state, corrections = start, []
        for offset in range(CHUNK):
            corrections.append((self.a[:, chunk, offset] - 1) * state + self.written[:, chunk, offset])
            state = state + corrections[-1]
        return torch.stack(corrections, dim=1)  # [batch, chunk, width]

    def carry(self, start, chunk, writes):
        return start + writes.sum(1)

    def steps(self, asked, writes):
        corrections = torch.stack(writes, dim=1)  # [batch, asked, chunk, width]

        def advance(running, chunks, step):
            running.add_(corrections[:, chunks, step])

        return advance


def toy(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    log_a = -torch.rand(BATCH, SEQ, WIDTH, generator=generator)
    b = torch.randn(BATCH, SEQ, WIDTH, generator=generator)
    return log_a, b, torch.randn(BATCH, WIDTH, generator=generator)


def token_loop(log_a, b, initial_state) -> torch.Tensor:
    """The state after every token, ``[batch, seq, width]``, one token at a time."""
    state = torch.zeros(BATCH, WIDTH) if initial_state is None else initial_state
    states = []
    for t in range(SEQ):
        state = log_a[:, t].exp() * state + b[:, t]
        states.append(state)
    return torch.stack(states, dim=1)


POSITIONS = [
    None,
    0,
    CHUNK - 1,  # the last token of the first chunk
    CHUNK,  # the first of the second
    3 * CHUNK + 2,
    -1,  # in the last, partial, chunk
    -SEQ,
    slice(None, None, 5),
    slice(CHUNK - 1, 3 * CHUNK + 1, CHUNK),  # chunk edges
    slice(40, None),
    [33, 2, 33, -1, CHUNK],  # out of order, repeated, negative
    torch.tensor([17, 9]),
    [],
]


@pytest.mark.parametrize("recurrence", [Decaying, Correcting])
@pytest.mark.parametrize("start", [True, False], ids=["initial_state", "zeros"])
@pytest.mark.parametrize("positions", POSITIONS, ids=repr)
def test_states_are_the_token_loops(recurrence, start, positions):
    log_a, b, initial_state = toy(seed=0)
    initial_state = initial_state if start else None
    every = token_loop(log_a, b, initial_state)
    expected = every if positions is None else every[:, positions]
    states = recurrence(log_a, b, initial_state).states(positions)
    assert states.shape == expected.shape
    torch.testing.assert_close(states, expected, rtol=1e-5, atol=1e-5)


def test_states_come_in_the_asked_dtype_and_an_int_drops_the_axis():
    log_a, b, initial_state = toy(seed=1)
    recurrence = Decaying(log_a, b, initial_state, dtype=torch.bfloat16)
    states = recurrence.states(slice(None, None, 7))
    assert states.dtype == torch.bfloat16 and states.shape == (BATCH, 8, WIDTH)
    assert recurrence.states(-3).shape == (BATCH, WIDTH)
    torch.testing.assert_close(states, token_loop(log_a, b, initial_state)[:, ::7].to(torch.bfloat16))
