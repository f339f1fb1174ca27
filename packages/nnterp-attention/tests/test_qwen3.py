from nnterp.testing import AttentionSuite, LayerSuite


class TestQwen3(LayerSuite, AttentionSuite):
    family = "qwen3"
