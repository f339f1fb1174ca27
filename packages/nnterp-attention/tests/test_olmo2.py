from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP
from nnterp.testing import family_suite


class TestOlmo2(family_suite("olmo2")):
    def test_post_norm_block_has_no_pre_norm_outputs(self) -> None:
        support = self.model.support()
        every = range(self.model.num_layers)
        assert support["attention_norm_output"] == {layer: POST_NORM_ATTENTION for layer in every}
        assert support["mlp_norm_output"] == {layer: POST_NORM_MLP for layer in every}
        assert support["layer_mid"] is None
