from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite


class TestOlmoe(LayerSuite, AttentionSuite, MoeSuite):
    family = "olmoe"
