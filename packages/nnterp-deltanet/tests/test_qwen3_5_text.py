from nnterp.testing import ForwardChangeSuite, family_suite


class TestQwen3_5Text(family_suite("qwen3_5_text"), ForwardChangeSuite):
    pass
