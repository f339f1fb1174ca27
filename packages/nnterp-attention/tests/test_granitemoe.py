from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite


class TestGraniteMoe(LayerSuite, AttentionSuite, MoeSuite):
    family = "granitemoe"
