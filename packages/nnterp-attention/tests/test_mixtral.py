from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite


class TestMixtral(LayerSuite, AttentionSuite, MoeSuite):
    family = "mixtral"
