"""MiniMax's ``state_trajectory`` reuses a mixer's memory from trace to trace, and never a tensor someone holds."""

from nnterp.testing.states_memory import StatesMemorySuite


class TestTrajectoryMemory(StatesMemorySuite):
    family = "minimax"
    states = "state_trajectory"
    gradient = False
