"""MiniMax: lightning attention, softmax attention and a sparse mixture of experts, with a weighted residual.

The same suites ``nnterp check minimax`` runs (``nnterp.testing.assembly.suite_for``).
"""

from nnterp.testing import AttentionSuite, MoeSuite
from nnterp_lightning.testing import LightningAttentionSuite, MiniMaxLayerSuite


class TestMiniMax(MoeSuite, LightningAttentionSuite, MiniMaxLayerSuite, AttentionSuite):
    family = "minimax"
