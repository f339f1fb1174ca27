from nnterp import PARALLEL
from nnterp.testing import LayerSuite, family_suite


class TestGPTNeoX(family_suite("gpt_neox")):
    """The default, parallel block: both sublayers read the block's input."""

    def test_parallel_block_has_no_layer_mid(self) -> None:
        assert self.model.support()["layer_mid"] == {layer: PARALLEL for layer in range(self.model.num_layers)}


class TestGPTNeoXSequential(LayerSuite):
    """use_parallel_residual=False: a sequential pre-norm block, with a stream between the sublayers."""

    family = "gpt_neox"
    load = {"use_parallel_residual": False}

    def test_sequential_block_has_layer_mid(self) -> None:
        assert self.model.support()["layer_mid"] is None
