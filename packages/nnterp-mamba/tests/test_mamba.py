from nnterp.testing import LayerSuite
from nnterp_mamba.testing import SelectiveScanSuite


class TestMamba(LayerSuite, SelectiveScanSuite):
    family = "mamba"
