from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite


class TestQwen2Moe(LayerSuite, AttentionSuite, MoeSuite):
    family = "qwen2_moe"
