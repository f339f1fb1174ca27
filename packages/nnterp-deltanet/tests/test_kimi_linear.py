from nnterp.testing import AttentionSuite, ForwardChangeSuite, LayerSuite, MoeSuite, draw_selection_bias
from nnterp_deltanet.testing import DeltaNetSuite


class TestKimiLinear(LayerSuite, AttentionSuite, DeltaNetSuite, MoeSuite, ForwardChangeSuite):
    family = "kimi_linear"

    @classmethod
    def build_model(cls):
        # A checkpoint's selection bias is learned; the tiny model's zeros would leave the scoring's bias unchecked.
        return draw_selection_bias(super().build_model(), 0.02)
