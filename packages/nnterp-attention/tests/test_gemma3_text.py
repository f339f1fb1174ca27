from nnterp.testing import AttentionSuite, LayerSuite


class TestGemma3Text(LayerSuite, AttentionSuite):
    family = "gemma3_text"
