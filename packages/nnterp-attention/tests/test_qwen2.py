from nnterp.testing import AttentionSuite, LayerSuite


class TestQwen2(LayerSuite, AttentionSuite):
    family = "qwen2"
