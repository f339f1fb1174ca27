"""Routed ``states`` reuse a mixer's memory from trace to trace, and never a tensor someone still holds."""

import warnings

import pytest
import torch

from nnterp import REGISTRY, route_kernels
from nnterp.testing.models import tiny_standardized

FAMILY = "qwen3_5_text"
LONGER, SHORTER = "The quick brown fox jumps over the lazy dog", "A lazy dog"


@pytest.fixture(scope="module")
def model():
    family = REGISTRY.family(FAMILY)
    route_kernels(family, "torch")
    try:
        yield tiny_standardized(FAMILY)
    finally:
        with warnings.catch_warnings():
            # the model was traced under "torch" and keeps it, as intended
            warnings.filterwarnings("ignore", r"route_kernels\(\.\.\., 'default'\)")
            route_kernels(family, "default")


def states(model, prompt: str, grad: bool = False) -> torch.Tensor:
    """The first mixer's ``states`` on ``prompt``."""
    with torch.set_grad_enabled(grad), model.trace(prompt):
        saved = model.layers[0].linear_attn.states.save()
    return saved


def memory(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def test_states_nobody_holds_any_more_are_overwritten_by_the_next_trace(model):
    first = memory(states(model, LONGER))
    reused = states(model, SHORTER)
    assert memory(reused) == first, "the next trace's states took fresh memory though nothing held the last ones"
    fresh = states(model, SHORTER)  # ``reused`` is held: fresh memory
    assert memory(fresh) != memory(reused)
    assert torch.equal(reused, fresh), "states written into reused memory differ from those in fresh memory"


def test_a_saved_states_or_a_view_of_it_never_changes_when_the_next_trace_runs(model):
    kept = states(model, LONGER)
    before = kept.clone()
    later = states(model, SHORTER)
    assert torch.equal(kept, before), "a later trace overwrote the states a user kept"
    assert memory(later) != memory(kept)
    view, view_before = kept[:, 2], kept[:, 2].clone()
    del kept, later
    states(model, SHORTER)
    assert torch.equal(view, view_before), "a later trace overwrote a view of the states a user kept"


def test_states_recording_a_gradient_take_fresh_memory_and_leave_the_kept_one(model):
    kept = memory(states(model, LONGER))
    tracked = states(model, LONGER, grad=True)
    assert tracked.requires_grad and tracked.grad_fn is not None, "states lost their gradient"
    assert memory(tracked) != kept, "states recording a gradient were written into the kept memory"
    assert memory(states(model, SHORTER)) == kept
