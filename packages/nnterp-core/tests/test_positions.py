"""nnterp.positions: the positions= selection, and the chunk stepping every state trajectory writes its states with."""

import pytest
import torch

from nnterp import positions
from nnterp.positions import asked_chunks, rank_one_steps, select_positions, write_chunk_states
from nnterp.testing.recurrent import POSITION_IDS, POSITIONS, close_relative, selected

SEQ, CHUNK = 150, 16
BATCH, HEADS, ROWS, COLUMNS = 2, 3, 4, 5


def recurrence(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """A decay and a rank-one write per token, ``[batch, seq, heads, ...]``, and a starting state."""
    generator = torch.Generator().manual_seed(seed)
    decay = torch.rand(BATCH, SEQ, HEADS, ROWS, 1, generator=generator)
    left = torch.randn(BATCH, SEQ, HEADS, ROWS, 1, generator=generator)
    right = torch.randn(BATCH, SEQ, HEADS, 1, COLUMNS, generator=generator)
    start = torch.randn(BATCH, HEADS, ROWS, COLUMNS, generator=generator)
    return decay, left, right, start


def every_state(decay, left, right, start) -> torch.Tensor:
    """The recurrence stepped token by token: the state after each token, ``[batch, seq, heads, rows, columns]``."""
    state, states = start, []
    for t in range(SEQ):
        state = decay[:, t] * state + left[:, t] * right[:, t]
        states.append(state)
    return torch.stack(states, dim=1)


def chunk_states(decay, left, right, start, chosen, dtype=torch.float32) -> torch.Tensor:
    """write_chunk_states given each asked chunk's true start state, as a family's chunked algorithm hands it."""
    needed, order, single = select_positions(chosen, SEQ)
    states = torch.empty(BATCH, len(needed), HEADS, ROWS, COLUMNS, dtype=dtype)
    if len(needed):
        chunks = asked_chunks(needed, CHUNK)
        before = torch.cat([start.unsqueeze(1), every_state(decay, left, right, start)], dim=1)
        starts = before[:, chunks * CHUNK]
        pad = -SEQ % CHUNK

        def by_chunk(tensor: torch.Tensor) -> torch.Tensor:
            padded = torch.cat([tensor, tensor[:, :1].expand(-1, pad, *tensor.shape[2:])], dim=1)
            return padded.unflatten(1, (-1, CHUNK))[:, chunks]

        write_chunk_states(states, needed, CHUNK, starts, rank_one_steps(*(by_chunk(t) for t in (decay, left, right))))
    if order is not None:
        states = states[:, order]
    return states[:, 0] if single else states


@pytest.mark.parametrize("chosen", POSITIONS, ids=POSITION_IDS)
def test_stepped_chunks_write_the_asked_states(chosen):
    args = recurrence()
    close_relative(chunk_states(*args, chosen), selected(every_state(*args), chosen), f"positions={chosen!r}", 1e-6)


def test_blocks_of_one_chunk_write_the_same_states(monkeypatch):
    args = recurrence(seed=1)
    expected = every_state(*args)
    monkeypatch.setattr(positions, "BLOCK_ELEMENTS", 1)
    close_relative(chunk_states(*args, None), expected, "one chunk per block", 1e-6)
    close_relative(chunk_states(*args, [149, 3, 17, 3]), expected[:, [149, 3, 17, 3]], "a few positions", 1e-6)


def test_states_are_rounded_to_the_results_dtype_once():
    args = recurrence(seed=2)
    in_bf16 = chunk_states(*args, slice(None, None, 7), dtype=torch.bfloat16)
    assert in_bf16.dtype == torch.bfloat16
    assert torch.equal(in_bf16, chunk_states(*args, slice(None, None, 7)).to(torch.bfloat16))


def test_select_positions_sorts_dedupes_and_says_how_to_hand_back():
    needed, order, single = select_positions([7, -1, 7, 0], 10)
    assert needed.tolist() == [0, 7, 9] and order.tolist() == [1, 2, 1, 0] and not single
    needed, order, single = select_positions(-2, 10)
    assert needed.tolist() == [8] and order is None and single
    needed, order, _ = select_positions(slice(None, None, 4), 10)
    assert needed.tolist() == [0, 4, 8] and order is None


@pytest.mark.parametrize("chosen", [10, -11, [0, 10]], ids=["past_the_end", "before_the_start", "in_a_list"])
def test_positions_outside_the_call_are_refused(chosen):
    with pytest.raises(IndexError, match="outside this call's 10 tokens"):
        select_positions(chosen, 10)
