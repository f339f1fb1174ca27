"""xLSTM: pre-norm blocks of an mLSTM matrix memory and a gated feed-forward."""

import transformers
from transformers.models.xlstm import modeling_xlstm

from nnterp.testing import LayerSuite
from nnterp_xlstm.matrix_memory import MatrixMemory, forward_labels
from nnterp_xlstm.testing import MatrixMemorySuite


class TestXlstm(LayerSuite, MatrixMemorySuite):
    family = "xlstm"


def test_a_changed_forward_is_named_before_any_model_runs(monkeypatch) -> None:
    """A forward that no longer calls its backend makes every value unavailable with the family, version and call."""

    def forward(self, x, state=None):
        return self.out_proj(x), state

    forward_labels.cache_clear()
    monkeypatch.setattr(modeling_xlstm.xLSTMLayer, "forward", forward)
    try:
        reason = MatrixMemory.forward_mismatch(modeling_xlstm.xLSTMLayer)
    finally:
        monkeypatch.undo()
        forward_labels.cache_clear()
    assert reason is not None and "the xlstm family" in reason and "self.mlstm_backend" in reason
    assert transformers.__version__ in reason
    assert MatrixMemory.forward_mismatch(modeling_xlstm.xLSTMLayer) is None


def test_patch_state_says_what_it_cannot_carry_before_running() -> None:
    import pytest

    from nnterp import Unavailable
    from nnterp.analysis import patch_state
    from nnterp.testing import PROMPT, tiny_standardized

    model = tiny_standardized("xlstm")
    with pytest.raises(Unavailable, match=r"patch_state at layers\[0\]: .*normalizer.*set_state_after"):
        patch_state(model, PROMPT, PROMPT, positions=[1])
