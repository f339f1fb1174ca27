from nnterp.testing import draw_selection_bias, family_suite


class TestDeepseekV3(family_suite("deepseek_v3")):
    @classmethod
    def build_model(cls):
        # A checkpoint's selection bias is learned; the tiny model's zeros would leave the scoring's bias unchecked.
        return draw_selection_bias(super().build_model(), 0.05)
