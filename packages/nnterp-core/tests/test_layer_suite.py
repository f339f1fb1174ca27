from nnterp.testing import LayerSuite


class TestOlmoUnderCoreEnvoys(LayerSuite):
    """Core's Layer and Mlp alone satisfy the layer suite on a pre-norm family."""

    family = "olmo"
