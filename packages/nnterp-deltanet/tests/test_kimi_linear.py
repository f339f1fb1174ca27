from nnterp.testing import AttentionSuite, LayerSuite
from nnterp_deltanet.testing import DeltaNetSuite


class TestKimiLinear(LayerSuite, AttentionSuite, DeltaNetSuite):
    family = "kimi_linear"
