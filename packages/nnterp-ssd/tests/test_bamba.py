"""Bamba: a Mamba-2 block and an attention block, each with an MLP."""

from nnterp.testing import AttentionSuite, LayerSuite
from nnterp_ssd.testing import SSDSuite


class TestBamba(LayerSuite, AttentionSuite, SSDSuite):
    family = "bamba"
