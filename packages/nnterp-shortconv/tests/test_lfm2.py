import pytest

from nnterp.testing import ForwardChangeSuite, family_suite


class TestLfm2(family_suite("lfm2"), ForwardChangeSuite):
    def test_renamed_state_binding_is_named(self) -> None:
        pytest.skip("ShortConv's kernels bind no state per token: its windows are slices of the conv's input")
