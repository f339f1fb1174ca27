from nnterp.testing import ForwardChangeSuite, draw_selection_bias, family_suite


class TestKimiLinear(family_suite("kimi_linear"), ForwardChangeSuite):
    @classmethod
    def build_model(cls):
        # A checkpoint's selection bias is learned; the tiny model's zeros would leave the scoring's bias unchecked.
        return draw_selection_bias(super().build_model(), 0.02)
