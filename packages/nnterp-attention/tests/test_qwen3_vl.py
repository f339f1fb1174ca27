from nnterp.testing import family_suite
from nnterp.testing.suites import close


class TestQwen3VL(family_suite("qwen3_vl")):
    def test_the_blocks_take_the_patch_embeddings_plus_learned_positions(self) -> None:
        self.model.vision.source  # instrumented before the run: its forward is entered before the first read
        with self.model.trace(self.encoding()):
            patches = self.model.vision.patch_embeddings.save()
            positions = self.model.vision.source.pos_embeds_0.output.save()
            entering = self.model.vision.layers[0].layer_input.save()
        assert positions.abs().amax() > 0, "the position embedding is zero"
        close(entering, patches + positions, what="vision.layers[0].layer_input vs patch_embeddings + positions")

    def test_deepstack_adds_its_features_after_the_first_text_block_at_image_tokens(self) -> None:
        with self.model.trace(self.encoding()):
            deepstack = self.model.vision.deepstack_merger_list[0].output.save()
            features = self.model.vision.image_features.save()
            mask = self.model.vision.image_token_mask.save()
            entering = self.model.layers[0].layer_input.save()
            leaving = self.model.layers[0].layer_output.save()
            next_entering = self.model.layers[1].layer_input.save()
        close(entering[mask], features, what="layers[0].layer_input at image tokens vs image_features")
        close(next_entering[~mask], leaving[~mask], what="layers[1].layer_input at text tokens")
        close(next_entering[mask], leaving[mask] + deepstack, what="layers[1].layer_input at image tokens")
