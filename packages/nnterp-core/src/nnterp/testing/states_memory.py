"""The suite for a mixer whose per-token states reuse its memory from trace to trace (``states_memory``)."""

from __future__ import annotations

import unittest
from typing import ClassVar

import torch

from .suites import Suite

LONGER, SHORTER = "The quick brown fox jumps over the lazy dog", "A lazy dog"


def memory(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


class StatesMemorySuite(Suite):
    """Per-token states reuse the first mixer's memory once nobody holds them, and never a tensor someone holds.

    ``states`` names the value read on ``layers[0].<mixer>``: routed ``states``
    (whose family's class routes its kernels to the token loop around the
    model it builds), or ``state_trajectory``.
    """

    #: nnterp's own memory management, not a value's behaviour: run under pytest, not by ``nnterp check``.
    conformance: ClassVar[bool] = False
    mixer: ClassVar[str] = "linear_attn"
    states: ClassVar[str] = "states"
    #: Whether the states record a gradient where the model does: routed ``states`` do, a ``trajectory`` never.
    gradient: ClassVar[bool] = True

    def read(self, prompt: str, grad: bool = False) -> torch.Tensor:
        """The first mixer's per-token states on ``prompt``."""
        with torch.set_grad_enabled(grad), self.model.trace(prompt):
            saved = getattr(getattr(self.model.layers[0], self.mixer), self.states).save()
        return saved

    def test_states_nobody_holds_any_more_are_overwritten_by_the_next_trace(self) -> None:
        first = memory(self.read(LONGER))
        reused = self.read(SHORTER)
        assert memory(reused) == first, "the next trace's states took fresh memory though nothing held the last ones"
        fresh = self.read(SHORTER)  # ``reused`` is held: fresh memory
        assert memory(fresh) != memory(reused)
        assert torch.equal(reused, fresh), "states written into reused memory differ from those in fresh memory"

    def test_saved_states_or_a_view_of_them_never_change_when_the_next_trace_runs(self) -> None:
        kept = self.read(LONGER)
        before = kept.clone()
        later = self.read(SHORTER)
        assert torch.equal(kept, before), "a later trace overwrote the states a user kept"
        assert memory(later) != memory(kept)
        view, view_before = kept[:, 2], kept[:, 2].clone()
        del kept, later
        self.read(SHORTER)
        assert torch.equal(view, view_before), "a later trace overwrote a view of the states a user kept"

    def test_states_recording_a_gradient_take_fresh_memory_and_leave_the_kept_one(self) -> None:
        if not self.gradient:
            raise unittest.SkipTest(f"{self.states} records no gradient")
        kept = memory(self.read(LONGER))
        tracked = self.read(LONGER, grad=True)
        assert tracked.requires_grad and tracked.grad_fn is not None, "states lost their gradient"
        assert memory(tracked) != kept, "states recording a gradient were written into the kept memory"
        assert memory(self.read(SHORTER)) == kept

    def test_states_recording_no_gradient_reuse_the_memory_where_the_model_records_one(self) -> None:
        if self.gradient:
            raise unittest.SkipTest(f"{self.states} records a gradient where the model does")
        kept = memory(self.read(LONGER))
        read = self.read(LONGER, grad=True)
        assert not read.requires_grad
        assert memory(read) == kept, "states recording no gradient took fresh memory in a trace recording one"
