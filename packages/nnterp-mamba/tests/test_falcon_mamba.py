from nnterp.testing import LayerSuite
from nnterp_mamba.testing import SelectiveScanSuite


class TestFalconMamba(LayerSuite, SelectiveScanSuite):
    family = "falcon_mamba"
