from nnterp.testing import AttentionSuite, LayerSuite


class TestGemma2(LayerSuite, AttentionSuite):
    family = "gemma2"
