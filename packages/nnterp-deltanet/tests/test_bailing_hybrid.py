import pytest

pytest.importorskip("transformers.models.bailing_hybrid", reason="Bailing-Hybrid ships from transformers 5.20")

from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite, draw_selection_bias  # noqa: E402
from nnterp_deltanet.testing import DeltaNetSuite  # noqa: E402


class TestBailingHybrid(LayerSuite, AttentionSuite, DeltaNetSuite, MoeSuite):
    family = "bailing_hybrid"

    @classmethod
    def build_model(cls):
        # A checkpoint's selection bias is learned; the tiny model's zeros would leave the scoring's bias unchecked.
        return draw_selection_bias(super().build_model(), 0.02)
