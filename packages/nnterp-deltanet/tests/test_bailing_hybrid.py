import pytest

pytest.importorskip("transformers.models.bailing_hybrid", reason="Bailing-Hybrid ships from transformers 5.20")

from nnterp.testing import AttentionSuite, LayerSuite  # noqa: E402
from nnterp_deltanet.testing import DeltaNetSuite  # noqa: E402


class TestBailingHybrid(LayerSuite, AttentionSuite, DeltaNetSuite):
    family = "bailing_hybrid"
