from nnterp.testing import ForwardChangeSuite
from nnterp_rwkv.testing import RwkvLayerSuite, WkvSuite


class TestRwkv(RwkvLayerSuite, WkvSuite, ForwardChangeSuite):
    family = "rwkv"
