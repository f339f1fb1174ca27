from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite
from nnterp_mamba.testing import SelectiveScanSuite


class TestJamba(LayerSuite, AttentionSuite, SelectiveScanSuite, MoeSuite):
    family = "jamba"
