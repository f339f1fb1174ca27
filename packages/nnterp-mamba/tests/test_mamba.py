from nnterp.testing import ForwardChangeSuite, LayerSuite
from nnterp_mamba.testing import SelectiveScanSuite


class TestMamba(LayerSuite, SelectiveScanSuite, ForwardChangeSuite):
    family = "mamba"
