import pytest

pytest.importorskip("transformers.models.qwen4_exp", reason="Qwen4-exp is not in this transformers")

from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite  # noqa: E402
from nnterp_deltanet.testing import DeltaNetSuite  # noqa: E402


class TestQwen4Exp(LayerSuite, AttentionSuite, DeltaNetSuite, MoeSuite):
    family = "qwen4_exp_text"
