"""GPT-NeoX-Japanese: contributions read inside ``bias_dropout_add``, the last block's attention bias among them."""

import torch

from nnterp.testing import PROMPT, close, family_suite


class TestGPTNeoXJapanese(family_suite("gpt_neox_japanese")):
    @classmethod
    def build_model(cls):
        """The tiny model with the last block's attention bias off zero, its initial value, so that it shows."""
        model = super().build_model()
        bias = model._module.gpt_neox_japanese.layers[-1].attention.dense_bias
        with torch.no_grad():
            bias.copy_(torch.randn(bias.shape, generator=torch.Generator().manual_seed(0)))
        return model

    def test_the_last_blocks_attention_output_includes_its_bias(self) -> None:
        """The last attention returns its bias apart; what the block adds is the projection plus that bias."""
        attention = self.model.layers[-1].self_attn
        module = attention._module
        assert module.dense_bias is not None and module.dense_bias.abs().sum() > 0
        with self.model.trace(PROMPT):
            heads = attention.attention_head_outputs.save()
            added = attention.attention_output.save()
        with torch.no_grad():
            projected = module.dense(heads.flatten(-2))
        assert not torch.allclose(added, projected, atol=1e-3), "attention_output left out the bias"
        close(added, projected + module.dense_bias, what="attention_output vs dense(head outputs) + dense_bias")

    def test_a_layer_mid_write_reaches_the_mlp_norm_and_the_residual(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            written = torch.randn_like(layer.layer_mid).save()
            layer.layer_mid = written
            received = layer.mlp_norm_output.save()
            added = layer.mlp.mlp_output.save()
            leaving = layer.layer_output.save()
        with torch.no_grad():
            close(received, layer._module.post_attention_layernorm(written), what="mlp_norm_output after the write")
        close(leaving, written + added, what="layer_output vs written layer_mid + mlp_output")

    def test_scores_are_the_products_scaled_by_the_head_size(self) -> None:
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            queries = attention.attention_queries.save()
            keys = attention.attention_keys.save()
            scores = attention.attention_scores.save()
        seen = torch.tril(torch.ones(scores.shape[-2:], dtype=torch.bool))
        product = queries @ keys.transpose(-1, -2) / attention.head_dim**0.5
        close(scores[..., seen], product[..., seen], what="scores vs queries @ keys^T / sqrt(head_size)")
