"""xLSTM: pre-norm blocks of an mLSTM matrix memory and a gated feed-forward."""

import transformers
from transformers.models.xlstm import modeling_xlstm

from nnterp.testing import family_suite
from nnterp_xlstm.matrix_memory import MatrixMemory, forward_labels


class TestXlstm(family_suite("xlstm")):
    pass


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
