import pytest

pytest.importorskip("transformers.models.lara_mini", reason="Lara-mini ships from transformers 5.24")

from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite  # noqa: E402
from nnterp_deltanet.testing import DeltaNetSuite  # noqa: E402


class TestLaraMini(LayerSuite, AttentionSuite, DeltaNetSuite, MoeSuite):
    family = "lara_mini"
