import torch

from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT, close, family_suite
from nnterp.testing.vision import tiny_vision_model, tiny_vision_standardized
from nnterp_attention.testing import drawn_layer_scalars


class TestGemma4(family_suite("gemma4")):
    @classmethod
    def build_model(cls):
        # A scalar of one would let the identities it enters pass without it.
        return drawn_layer_scalars(tiny_vision_standardized(cls.family, **cls.load))

    @classmethod
    def save_model(cls, directory):
        model = cls.build_model()
        model._module.save_pretrained(directory)
        model.processor.save_pretrained(directory)

    @classmethod
    def same_model(cls, loaded):
        return drawn_layer_scalars(
            StandardizedTransformer(tiny_vision_model(cls.family, **cls.load), processor=loaded.processor)
        )

    def test_the_tower_pools_its_output_into_the_projector_input(self) -> None:
        encoding = self.encoding()
        with self.model.trace(encoding):
            tower = self.model.vision.tower_output.save()
            entering = self.model.projector.input.save()
            features = self.model.vision.image_features.save()
        config = self.model.vision.config
        k = config.pooling_kernel_size
        pooled = []
        for image, positions in zip(tower, encoding["image_position_ids"], strict=True):
            valid = (positions != -1).all(-1)
            width, height = (int(positions[valid][:, axis].max()) + 1 for axis in (0, 1))
            grid = image[valid].reshape(height // k, k, width // k, k, -1)
            pooled.append(grid.mean((1, 3)).flatten(0, 1) * config.hidden_size**0.5)
        close(entering, torch.cat(pooled), what="projector.input vs tower_output pooled k x k, padding dropped")
        assert features.shape[0] == entering.shape[0], "one image token per pooled token"

    def test_text_values_equal_gemma4_text_on_the_same_weights(self) -> None:
        from transformers import Gemma4ForCausalLM

        wrapper = self.model._module
        text = Gemma4ForCausalLM(wrapper.config.get_text_config()).eval()
        text.model.load_state_dict(wrapper.model.language_model.state_dict())
        text.lm_head.load_state_dict(wrapper.lm_head.state_dict())
        alone = StandardizedTransformer(text, tokenizer=self.model.tokenizer)
        assert alone.family.__name__.endswith("gemma4_text")
        readings = []
        for model in (self.model, alone):
            with model.trace(PROMPT):
                layer = model.layers[-1]
                readings.append((layer.ple.per_layer_output.save(), layer.layer_output.save(), model.logits.save()))
        for name, wrapped, plain in zip(("ple.per_layer_output", "layer_output", "logits"), *readings, strict=True):
            close(wrapped, plain, what=f"{name} of the wrapper vs gemma4_text on its weights")
