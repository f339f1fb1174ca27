from nnterp.testing import ForwardChangeSuite, family_suite


class TestRwkv(family_suite("rwkv"), ForwardChangeSuite):
    pass
