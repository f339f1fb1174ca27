from nnterp.testing import AttentionSuite, LayerSuite
from nnterp_deltanet.testing import DeltaNetSuite


class TestQwen3_5Moe(LayerSuite, AttentionSuite, DeltaNetSuite):
    family = "qwen3_5_moe"
