import pytest

from nnterp.testing import AttentionSuite, ForwardChangeSuite, LayerSuite
from nnterp_shortconv.testing import ShortConvSuite


class TestLfm2(LayerSuite, AttentionSuite, ShortConvSuite, ForwardChangeSuite):
    family = "lfm2"

    def test_renamed_state_binding_is_named(self) -> None:
        pytest.skip("ShortConv's kernels bind no state per token: its windows are slices of the conv's input")
