"""X-MOD: BERT's block with a language adapter added after the MLP, post-norm (its checkpoints') or pre-norm."""

import torch

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP
from nnterp.testing import PROMPT, AttentionSuite, LayerSuite, close, family_suite


class AdapterChecks:
    """The adapter's contribution is its language's adapter of the stream, and a write to it reaches layer_output."""

    def test_the_adapter_output_is_its_languages_adapter_of_the_stream(self) -> None:
        layer = self.model.layers[0]
        output = layer._module.output
        with self.model.trace(PROMPT):
            mid = layer.layer_mid.save()
            added = layer.mlp.mlp_output.save()
            adapted = layer.mlp.adapter_output.save()
        language = self.model._module.config.default_language
        other = next(name for name in output.adapter_modules if name != language)
        stream = self.stream_after(0, mid, [added], first=1)  # the stream the adapter reads: after the MLP's addition
        with torch.no_grad():
            close(adapted, output.adapter_modules[language](stream), what=f"adapter_output vs the {language} adapter")
            wrong = output.adapter_modules[other](stream)
        assert not torch.allclose(adapted, wrong, atol=1e-3), "the adapters of the two languages agree"

    def test_an_adapter_write_reaches_layer_output(self) -> None:
        layer = self.model.layers[0]
        parts: list[torch.Tensor] = []  # bound outside: a name first bound inside a trace does not survive it
        with self.model.trace(PROMPT):
            entering = layer.layer_input.save()
            parts.extend((layer.self_attn.attention_output.save(), layer.mlp.mlp_output.save()))
            read = layer.mlp.adapter_output.save()
            clean = read.clone().save()
            written = torch.zeros_like(clean).save()
            layer.mlp.adapter_output = written
            leaving = layer.layer_output.save()
        assert clean.abs().sum() > 0
        # the forward adds the stream to the adapter's tensor in place: neither what was read nor what was written moves
        close(read, clean, what="adapter_output as read, after the forward went on")
        close(written, torch.zeros_like(clean), what="the tensor assigned to adapter_output, after the forward went on")
        close(
            self.stream_after(0, entering, [*parts, written]), leaving, what="layer_output after zeroing adapter_output"
        )


class TestXmod(AdapterChecks, family_suite("xmod")):
    def test_post_norm_block_has_no_pre_norm_outputs(self) -> None:
        support = self.model.support()
        every = range(self.model.num_layers)
        assert support["attention_norm_output"] == {layer: POST_NORM_ATTENTION for layer in every}
        assert support["mlp_norm_output"] == {layer: POST_NORM_MLP for layer in every}

    def test_the_mlp_norm_runs_before_the_adapter_and_after_it(self) -> None:
        """Released checkpoints reuse the MLP's norm for the adapter: the stream is normalized by it twice."""
        assert self.model.layers[0].stream_norms() == (
            "attention.output.LayerNorm",
            "output.LayerNorm",
            "output.LayerNorm",
        )


class TestXmodPreNorm(AdapterChecks, LayerSuite, AttentionSuite):
    """``pre_norm``: the norms in front of the sublayers, the adapter's norm its own, the encoder's final norm last."""

    family = "xmod"
    load = {"pre_norm": True, "adapter_layer_norm": True}

    def test_pre_norms_feed_the_sublayers(self) -> None:
        layer = self.model.layers[0]
        block = layer._module
        with self.model.trace(PROMPT):
            entering = layer.layer_input.save()
            normed = layer.attention_norm_output.save()
            mid = layer.layer_mid.save()
            mlp_normed = layer.mlp_norm_output.save()
            mlp_input = layer.mlp_input.save()
        with torch.no_grad():
            close(normed, block.attention.output.LayerNorm(entering), what="attention_norm_output vs its norm")
            close(mlp_normed, block.output.LayerNorm(mid), what="mlp_norm_output vs output.LayerNorm(layer_mid)")
        close(mlp_input, mlp_normed, what="mlp_input vs mlp_norm_output")
        assert layer.stream_norms() == (None, "output.adapter_layer_norm", None)
