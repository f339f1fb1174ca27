"""The original GPT: a post-norm block returning lists, and an attention whose keys the forward holds transposed."""

import pytest
import torch

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP
from nnterp.testing import PROMPT, close, family_suite


class TestOpenAIGPT(family_suite("openai_gpt")):
    def test_post_norm_block_has_no_pre_norm_outputs(self) -> None:
        support = self.model.support()
        every = range(self.model.num_layers)
        assert support["attention_norm_output"] == {layer: POST_NORM_ATTENTION for layer in every}
        assert support["mlp_norm_output"] == {layer: POST_NORM_MLP for layer in every}

    def test_a_layer_mid_write_reaches_the_mlp_and_its_residual(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            written = torch.randn_like(layer.layer_mid).save()
            layer.layer_mid = written
            received = layer.mlp_input.save()
            added = layer.mlp.mlp_output.save()
            leaving = layer.layer_output.save()
        close(received, written, what="mlp_input after assigning layer_mid")
        with torch.no_grad():
            close(leaving, layer._module.ln_2(written + added), what="layer_output vs ln_2(layer_mid + mlp_output)")

    def test_scores_are_scaled_products_with_the_causal_mask(self) -> None:
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            queries = attention.attention_queries.save()
            keys = attention.attention_keys.save()
            scores = attention.attention_scores.save()
        product = queries @ keys.transpose(-1, -2) / attention.head_dim**0.5
        seen = torch.tril(torch.ones(scores.shape[-2:], dtype=torch.bool))
        close(scores[..., seen], product[..., seen], what="scores vs queries @ keys^T / sqrt(head_dim)")
        close(scores[..., ~seen], torch.full_like(scores[..., ~seen], -1e4), what="masked scores")

    def test_a_key_assignment_is_laid_back_transposed(self) -> None:
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            keys = attention.attention_keys.clone()
            keys[:, :, 0] = 0
            attention.attention_keys = keys
            scores = attention.attention_scores.save()
        close(scores[..., 0], torch.zeros_like(scores[..., 0]), what="the scores of a zeroed first key")

    def test_queries_refuse_in_place_edits(self) -> None:
        attention = self.model.layers[0].self_attn
        with pytest.raises(RuntimeError, match="modified inplace"):
            with self.model.trace(PROMPT):
                attention.attention_queries[:] = 0

    def test_head_outputs_project_to_the_attention_output(self) -> None:
        attention = self.model.layers[1].self_attn
        with self.model.trace(PROMPT):
            heads = attention.attention_head_outputs.save()
            output = attention.attention_output.save()
        with torch.no_grad():
            projected = attention._module.c_proj(heads.flatten(-2))
        close(projected, output, what="c_proj(head outputs) vs attention_output")

    def test_each_blocks_activation_is_its_own(self) -> None:
        """The activation module is shared by every block: each block's mlp_activation is still its own MLP's."""
        saved = []
        with self.model.trace(PROMPT):
            for layer in self.model.layers:
                saved.append((layer.mlp_input.save(), layer.mlp.mlp_activation.save()))
        for i, (entering, activation) in enumerate(saved):
            mlp = self.model.layers[i].mlp._module
            with torch.no_grad():
                close(
                    activation, mlp.act(mlp.c_fc(entering)), what=f"layers[{i}] mlp_activation vs act(c_fc(mlp_input))"
                )
