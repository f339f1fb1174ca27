from nnterp.testing import LayerSuite
from nnterp_rglru.testing import LocalAttentionSuite, RgLruSuite


class TestRecurrentGemma(LayerSuite, LocalAttentionSuite, RgLruSuite):
    family = "recurrent_gemma"
