from nnterp.testing import AttentionSuite, LayerSuite


class TestMistral(LayerSuite, AttentionSuite):
    family = "mistral"
