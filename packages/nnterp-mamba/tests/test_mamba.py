from nnterp.testing import ForwardChangeSuite, family_suite


class TestMamba(family_suite("mamba"), ForwardChangeSuite):
    pass
