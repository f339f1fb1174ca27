from nnterp.testing import AttentionSuite, LayerSuite
from nnterp.testing.suites import close
from nnterp_attention.testing import QwenVisionSuite


class TestQwen2VL(QwenVisionSuite, LayerSuite, AttentionSuite):
    family = "qwen2_vl"

    def test_the_blocks_take_the_patch_embeddings_as_they_are(self) -> None:
        with self.model.trace(self.encoding()):
            patches = self.model.vision.patch_embeddings.save()
            entering = self.model.vision.layers[0].layer_input.save()
        close(entering, patches, what="vision.layers[0].layer_input vs patch_embeddings")
