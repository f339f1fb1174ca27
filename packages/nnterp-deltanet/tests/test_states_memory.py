"""Routed ``states`` reuse a mixer's memory from trace to trace, and never a tensor someone still holds."""

import warnings

from nnterp import REGISTRY, route_kernels
from nnterp.testing.states_memory import StatesMemorySuite


class TestRoutedStatesMemory(StatesMemorySuite):
    family = "qwen3_5_text"

    @classmethod
    def setup_class(cls) -> None:
        route_kernels(REGISTRY.family(cls.family), "torch")
        super().setup_class()

    @classmethod
    def teardown_class(cls) -> None:
        with warnings.catch_warnings():
            # the model was traced under "torch" and keeps it, as intended
            warnings.filterwarnings("ignore", r"route_kernels\(\.\.\., 'default'\)")
            route_kernels(REGISTRY.family(cls.family), "default")
