from nnterp.testing import family_suite
from nnterp.testing.suites import close


class TestQwen2VL(family_suite("qwen2_vl")):
    def test_the_blocks_take_the_patch_embeddings_as_they_are(self) -> None:
        with self.model.trace(self.encoding()):
            patches = self.model.vision.patch_embeddings.save()
            entering = self.model.vision.layers[0].layer_input.save()
        close(entering, patches, what="vision.layers[0].layer_input vs patch_embeddings")
