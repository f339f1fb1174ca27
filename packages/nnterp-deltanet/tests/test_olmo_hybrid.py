from nnterp.testing import AttentionSuite, LayerSuite
from nnterp_deltanet.testing import DeltaNetSuite


class TestOlmoHybrid(LayerSuite, AttentionSuite, DeltaNetSuite):
    family = "olmo_hybrid"
