from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite
from nnterp_deltanet.testing import DeltaNetSuite


class TestQwen3_5Moe(LayerSuite, AttentionSuite, DeltaNetSuite, MoeSuite):
    family = "qwen3_5_moe"
