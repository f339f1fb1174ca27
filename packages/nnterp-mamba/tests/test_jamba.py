from nnterp.testing import AttentionSuite, LayerSuite
from nnterp_mamba.testing import SelectiveScanSuite


class TestJamba(LayerSuite, AttentionSuite, SelectiveScanSuite):
    family = "jamba"
