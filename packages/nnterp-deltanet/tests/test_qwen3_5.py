import tempfile

import torch

from nnterp import StandardizedTransformer
from nnterp.testing import family_suite
from nnterp.testing.suites import PROMPT, close, raises
from nnterp.testing.vision import tiny_vision_model


class TestQwen3_5(family_suite("qwen3_5")):
    def test_the_mixers_run_over_the_image_tokens(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        read: list[torch.Tensor] = []
        with self.model.trace(self.encoding()):
            mask = self.model.vision.image_token_mask.save()
            read.extend((mixer.state_trajectory.save(), mixer.states.save()))
        assert read[1].shape[1] == mask.shape[1] > int(mask.sum()) > 0
        assert torch.allclose(read[0], read[1], rtol=1e-4, atol=1e-5), f"layers[{layer}] trajectory vs states"

    def test_without_a_processor_it_loads_for_text_with_its_mixers(self) -> None:
        wrapper = StandardizedTransformer(tiny_vision_model(self.family), processor=self.model.processor)
        logits = []
        with tempfile.TemporaryDirectory() as directory:
            wrapper._module.save_pretrained(directory)
            # by its config's model type AutoTokenizer would build Qwen3.5's tokenizer class over the local one
            model = StandardizedTransformer(directory, tokenizer=self.model.tokenizer)
            for loaded in (model, wrapper):
                with loaded.trace(PROMPT):
                    loaded.layers[self.recurrent_layers()[0]].linear_attn.attention_output.save()
                    logits.append(loaded.logits.save())
        assert model.family is self.model.family and type(model._module).__name__ == "Qwen3_5ForCausalLM"
        with raises(AttributeError, "no vision tower"):
            model.vision
        close(*logits, what="logits of the text load vs the wrapper on a text prompt")
