from nnterp.testing import AttentionSuite, LayerSuite, MoeSuite


class TestQwen3Moe(LayerSuite, AttentionSuite, MoeSuite):
    family = "qwen3_moe"
