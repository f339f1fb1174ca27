from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT, close, family_suite, tiny_standardized
from nnterp_attention.testing import drawn_layer_scalars


class TestGemma4Unified(family_suite("gemma4_unified")):
    @classmethod
    def build_model(cls):
        return drawn_layer_scalars(tiny_standardized(cls.family, **cls.load))

    def test_the_wrapper_loads_for_text_with_its_text_model_s_values(self) -> None:
        from transformers import Gemma4UnifiedForCausalLM

        wrapper = self.model._module
        assert type(wrapper).__name__ == "Gemma4UnifiedForConditionalGeneration"
        text = Gemma4UnifiedForCausalLM(wrapper.config.get_text_config()).eval()
        text.model.load_state_dict(wrapper.model.language_model.state_dict())
        text.lm_head.load_state_dict(wrapper.lm_head.state_dict())
        alone = StandardizedTransformer(text, tokenizer=self.model.tokenizer)
        assert alone.family.__name__.endswith("gemma4_unified_text")
        readings = []
        for model in (self.model, alone):
            values: list = []
            with model.trace(PROMPT):
                for layer in model.layers:
                    values += [layer.self_attn.attention_output.save(), layer.layer_output.save()]
                values.append(model.logits.save())
            readings.append(values)
        for i, (wrapped, plain) in enumerate(zip(*readings, strict=True)):
            close(wrapped, plain, what=f"reading {i} of the wrapper vs gemma4_unified_text on its weights")
