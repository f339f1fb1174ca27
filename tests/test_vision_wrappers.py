"""A multimodal wrapper takes its text model's envoys from the family of its text_config, whichever that is."""

import io

import pytest
import torch
from transformers import AutoModelForImageTextToText

from nnterp import StandardizedTransformer, UnknownModelType
from nnterp.cli import support
from nnterp.families import llava, qwen2
from nnterp.testing import close, tiny_config
from nnterp.testing.vision import save_tiny_vision, tiny_images, tiny_processor, vision_tokenizer
from nnterp_attention import Attention

#: LLaVA's tiny text model, as a Qwen2.
QWEN2_TEXT = {**llava.TINY_CONFIG["text_config"], "model_type": "qwen2"}


def llava_over(text_config: dict) -> torch.nn.Module:
    image_token_id = vision_tokenizer("llava").convert_tokens_to_ids("<image>")
    config = tiny_config("llava", text_config=text_config, image_token_id=image_token_id)
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(config, attn_implementation="eager").eval()


def test_a_llava_over_qwen2_serves_qwen2s_blocks_and_its_images():
    model = StandardizedTransformer(llava_over(QWEN2_TEXT), processor=tiny_processor("llava"))
    attention = model.layers[0].self_attn
    assert type(attention) is qwen2.ENVOYS[type(attention._module)]
    assert isinstance(attention, Attention)
    inputs = model.processor(text="hi <image> there", images=tiny_images((40, 50)), return_tensors="pt")
    with model.trace(inputs):
        features = model.vision.image_features.save()
        mask = model.vision.image_token_mask.save()
        entering = model.layers[0].layer_input.save()
        attention_output = model.layers[0].self_attn.attention_output.save()
        mlp_output = model.layers[0].mlp.mlp_output.save()
        leaving = model.layers[0].layer_output.save()
    close(entering[mask], features, what="layers[0].layer_input[image_token_mask]")
    close(entering + attention_output + mlp_output, leaving, what="layers[0] of the Qwen2 text model")


def test_a_text_model_no_family_serves_is_named_before_the_model_is_wrapped():
    module = llava_over(QWEN2_TEXT)
    module.config.text_config.model_type = "qwen2_unreleased"
    with pytest.raises(UnknownModelType, match="qwen2_unreleased"):
        StandardizedTransformer(module, processor=tiny_processor("llava"))


def test_nnterp_support_lists_the_tower_beside_the_text_model(tmp_path):
    save_tiny_vision("llava", tmp_path)
    out = io.StringIO()
    support(out, str(tmp_path))
    lines = out.getvalue().splitlines()
    assert "  vision.image_features: available" in lines
    # Loaded as a user would, with sdpa: the tower's pattern says how to get it.
    pattern = [line for line in lines if line.startswith("  vision.self_attn.attention_probabilities [layer 0]")]
    assert len(pattern) == 1 and "attn_implementation='eager'" in pattern[0], pattern
    assert "  layer_output: available" in lines
