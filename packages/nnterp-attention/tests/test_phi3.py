from nnterp.testing import AttentionSuite, LayerSuite


class TestPhi3(LayerSuite, AttentionSuite):
    family = "phi3"
