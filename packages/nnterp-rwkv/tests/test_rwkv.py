from nnterp.testing import ForwardChangeSuite
from nnterp_rwkv.testing import RwkvLayerSuite, WkvSuite


class TestRwkv(RwkvLayerSuite, WkvSuite, ForwardChangeSuite):
    family = "rwkv"


def test_patch_state_says_what_it_cannot_carry_before_running():
    import pytest

    from nnterp import Unavailable
    from nnterp.analysis import patch_state
    from nnterp.testing import PROMPT, tiny_standardized

    model = tiny_standardized("rwkv")
    with pytest.raises(Unavailable, match=r"patch_state at layers\[0\]: .*token shift.*set_state_after"):
        patch_state(model, PROMPT, PROMPT, positions=[1])
