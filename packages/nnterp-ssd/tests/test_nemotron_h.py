"""Nemotron-H: a Mamba-2 block, an attention block, an MLP block and a mixture-of-experts block."""

from nnterp.testing import AttentionSuite, LayerSuite
from nnterp_ssd.testing import SSDSuite


class TestNemotronH(LayerSuite, AttentionSuite, SSDSuite):
    family = "nemotron_h"
