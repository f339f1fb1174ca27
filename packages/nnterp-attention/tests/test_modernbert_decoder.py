"""ModernBERT's decoder: an identity for the first block's attention norm, a gated MLP, a sliding window."""

import torch

from nnterp.testing import PROMPT, close, family_suite
from nnterp.testing.suites import Suite


class TestModernBertDecoder(family_suite("modernbert_decoder")):
    def test_the_first_blocks_attention_reads_the_stream_itself(self) -> None:
        """Block 0 has no attention norm (an identity): what the attention is called with is layer_input; block 1 norms it."""
        saved = []
        with self.model.trace(PROMPT):
            for layer in self.model.layers:
                saved.append((layer.layer_input.save(), layer.attention_norm_output.save()))
        (entering, normed), (later, later_normed) = saved
        close(normed, entering, what="layers[0].attention_norm_output vs layers[0].layer_input")
        with torch.no_grad():
            expected = self.model.layers[1]._module.attn_norm(later)
        assert not torch.allclose(later_normed, later, atol=1e-3), "layers[1]'s attention norm did nothing"
        close(later_normed, expected, what="layers[1].attention_norm_output vs attn_norm(layer_input)")

    def test_gated_neurons_are_the_activation_times_the_gate(self) -> None:
        layer = self.model.layers[0]
        mlp = layer.mlp._module
        with self.model.trace(PROMPT):
            entering = layer.mlp_input.save()
            activation = layer.mlp.mlp_activation.save()
            neurons = layer.mlp.mlp_neurons.save()
            added = layer.mlp.mlp_output.save()
        with torch.no_grad():
            up, gate = mlp.Wi(entering).chunk(2, dim=-1)
            close(activation, mlp.act(up), what="mlp_activation vs act(first half of Wi(mlp_input))")
            close(neurons, mlp.act(up) * gate, what="mlp_neurons vs act(input) * gate")
            close(mlp.Wo(neurons), added, what="Wo(mlp_neurons) vs mlp_output")


class TestModernBertDecoderWindow(Suite):
    """The tiny model with a window of 2 keys, shorter than the prompt (the default one's is longer than every prompt)."""

    family = "modernbert_decoder"
    load = {"local_attention": 4}

    def test_the_sliding_layer_sees_only_its_window(self) -> None:
        """The sliding layer's pattern is zero past its window (``sliding_window`` keys back), the full layer's is not."""
        window = self.model._module.config.sliding_window
        patterns = []
        with self.model.trace(PROMPT):
            for layer in self.model.layers:
                patterns.append(layer.self_attn.attention_probabilities.save())
        seq = patterns[0].shape[-1]
        assert seq > window + 1, "the prompt is too short to reach past the window"
        seen = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
        far = seen & ~torch.triu(seen, -window)
        assert (patterns[0][..., far] > 0).all(), "the full-attention layer ignores far keys"
        close(patterns[1][..., far], torch.zeros_like(patterns[1][..., far]), what="the sliding layer's far keys")
