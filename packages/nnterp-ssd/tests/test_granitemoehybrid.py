"""GraniteMoeHybrid: a Mamba-2 block and an attention block, each with experts beside a shared MLP, scaled into the stream."""

from nnterp.testing import AttentionSuite, LayerSuite
from nnterp_ssd.testing import SSDSuite


class TestGraniteMoeHybrid(LayerSuite, AttentionSuite, SSDSuite):
    family = "granitemoehybrid"


class TestGraniteMoeHybridDense(LayerSuite):
    """Without experts the shared MLP is the whole feed-forward, and its neurons are served."""

    family = "granitemoehybrid"
    load = {"num_local_experts": 0}
