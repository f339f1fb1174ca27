from nnterp.testing import AttentionSuite, ForwardChangeSuite, LayerSuite
from nnterp_deltanet.testing import DeltaNetSuite


class TestQwen3_5Text(LayerSuite, AttentionSuite, DeltaNetSuite, ForwardChangeSuite):
    family = "qwen3_5_text"
