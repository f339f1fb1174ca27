"""Zamba2: Mamba-2 blocks around a hybrid block whose shared transformer feeds its mixer."""

from nnterp.testing import LayerSuite
from nnterp_ssd.testing import SSDSuite


class TestZamba2(LayerSuite, SSDSuite):
    family = "zamba2"
