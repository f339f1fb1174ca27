import tempfile

import torch

from nnterp import StandardizedTransformer
from nnterp.analysis.lens import logit_lens
from nnterp.testing import family_suite
from nnterp.testing.suites import close, raises
from nnterp.testing.vision import tiny_vision_model, vision_tokenizer


class TestLlama4(family_suite("llama4")):
    def test_the_tower_output_keeps_the_cls_token_the_adapter_drops(self) -> None:
        vision = self.model.vision
        with self.model.trace(self.encoding()):
            tower = vision.tower_output.save()
            entering = vision.vision_adapter.input.save()
        assert tower.shape[1] == (vision.image_size // vision.patch_size) ** 2 + 1, "a tile's patches and its CLS token"
        close(entering, tower[:, :-1], what="vision_adapter.input vs tower_output less its last (CLS) token")

    def test_the_projector_takes_every_tile_of_the_adapter_output(self) -> None:
        vision = self.model.vision
        with self.model.trace(self.encoding()):
            folded = vision.vision_adapter.output.save()
            entering = self.model.projector.input.save()
            leaving = self.model.projector.output.save()
            features = vision.image_features.save()
        # transformers 5.25 hands the projector every tile's tokens as they come, [tiles, tokens, ...]; before, flattened
        close(
            entering.flatten(0, -2),
            folded.flatten(0, 1),
            what="projector.input vs the adapter's output, tile after tile",
        )
        close(features, leaving.flatten(0, -2), what="image_features vs the projector's output")

    def test_each_tile_fills_one_run_of_patch_tokens(self) -> None:
        vision, config = self.model.vision, self.model._module.config.vision_config
        per_tile = int((vision.image_size // vision.patch_size) ** 2 * config.pixel_shuffle_ratio**2)
        with self.model.trace(self.encoding()):
            mask = vision.image_token_mask.save()
        edges = torch.diff(
            mask[0].int(), prepend=torch.zeros(1, dtype=torch.int), append=torch.zeros(1, dtype=torch.int)
        )
        runs = ((edges == -1).nonzero() - (edges == 1).nonzero()).flatten().tolist()
        assert runs == [per_tile] * len(self.SIZES), f"patch token runs: {runs}, {per_tile} tokens per tile expected"

    def test_a_tower_mlp_output_is_its_neurons_through_fc2(self) -> None:
        mlp = self.model.vision.layers[0].mlp
        with self.model.trace(self.encoding()):
            neurons = mlp.mlp_neurons.save()
            added = mlp.mlp_output.save()
        with torch.no_grad():
            close(mlp.down_proj._module(neurons), added, what="vision.layers[0].mlp: fc2(mlp_neurons) vs mlp_output")

    def test_the_logit_lens_of_the_last_block_is_the_logits(self) -> None:
        with self.model.trace("hi there"):
            lens = logit_lens(self.model, layers=-1).save()
            logits = self.model.logits.save()
        close(lens, logits, what="logit_lens of the last block vs logits, through the text model's head")

    def test_a_skipped_tower_block_passes_its_input_on(self) -> None:
        layers = self.model.vision.layers
        with self.model.trace(self.encoding()):
            entering = layers[0].layer_input.save()
            layers[0].skip(entering)
            received = layers[1].layer_input.save()
        close(received, entering, what="vision.layers[1].layer_input after skipping vision.layers[0]")


def test_without_its_processor_a_checkpoint_loads_its_text_model_for_text() -> None:
    wrapper, tokenizer = tiny_vision_model("llama4"), vision_tokenizer("llama4")
    with tempfile.TemporaryDirectory() as directory:
        wrapper.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        model = StandardizedTransformer(directory)
        assert model.family.MODEL_TYPES == ("llama4",)
        with model.trace("hi there"):
            routed = model.layers[1].mlp.routed_output.save()
            logits = model.logits.save()
    with torch.no_grad():
        expected = wrapper.language_model(**tokenizer("hi there", return_tensors="pt")).logits
    assert routed.shape == (1, len("hi there"), model.hidden_size)
    close(logits, expected, what="logits of the text load vs the wrapper's text model")
    with raises(AttributeError, "no vision tower"):
        model.vision
