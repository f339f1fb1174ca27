from nnterp.testing import AttentionSuite, LayerSuite


class TestLlama(LayerSuite, AttentionSuite):
    family = "llama"
