import torch

from nnterp.testing import family_suite
from nnterp.testing.suites import close


class TestGemma3(family_suite("gemma3")):
    def test_the_projector_pools_the_tower_output(self) -> None:
        with self.model.trace(self.encoding()):
            tower = self.model.vision.tower_output.save()
            entering = self.model.projector.input.save()
            leaving = self.model.projector.output.save()
        close(entering, tower, what="projector.input vs vision.tower_output")
        assert leaving.shape[:2] == (tower.shape[0], self.model._module.config.mm_tokens_per_image)

    def test_each_image_takes_mm_tokens_per_image_tokens_in_one_run(self) -> None:
        with self.model.trace(self.encoding()):
            leaving = self.model.projector.output.save()
            features = self.model.vision.image_features.save()
            mask = self.model.vision.image_token_mask.save()
        # Each image's tokens are one run, between its begin- and end-of-image tokens.
        runs = [
            len(run) for run in torch.tensor_split(mask[0], torch.diff(mask[0].int()).nonzero().flatten() + 1) if run[0]
        ]
        assert runs == [self.model._module.config.mm_tokens_per_image] * len(self.SIZES), f"image token runs: {runs}"
        close(features, leaving.flatten(0, 1), what="image_features vs the projector's output, image after image")

    def test_tower_mlp_neurons_are_what_its_down_projection_sums(self) -> None:
        mlp = self.model.vision.layers[0].mlp
        with self.model.trace(self.encoding()):
            neurons = mlp.mlp_neurons.save()
            output = mlp.mlp_output.save()
        # SigLIP's fc2, under its standard name: the family aliases SigLIP's spellings as CLIP's.
        fc2 = mlp._module.fc2
        close(torch.nn.functional.linear(neurons, fc2.weight, fc2.bias), output, what="fc2(mlp_neurons) vs mlp_output")
