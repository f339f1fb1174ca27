from nnterp.testing import AttentionSuite, LayerSuite
from nnterp_deltanet.testing import DeltaNetSuite


class TestQwen3Next(LayerSuite, AttentionSuite, DeltaNetSuite):
    family = "qwen3_next"
