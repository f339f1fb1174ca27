"""OPT: the MLP's values over the flattened tokens served as [batch, seq, ...], pre-norm and post-norm."""

import torch

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP
from nnterp.testing import PROMPT, AttentionSuite, LayerSuite, close, family_suite
from nnterp.testing.suites import BATCH


class FlatTokenChecks:
    """The values OPT reads on one row per token are each invoke's [batch, seq, ...], and writes land in its rows."""

    def test_mlp_values_are_the_flat_tensors_unflattened(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(BATCH[0]):
            entering = layer.mlp_input.save()
            activation = layer.mlp.mlp_activation.save()
            neurons = layer.mlp.mlp_neurons.save()
            added = layer.mlp.mlp_output.save()
        assert entering.dim() == 3 and neurons.shape[:2] == entering.shape[:2]
        assert neurons.shape[-1] == layer.mlp.intermediate_size == self.model._module.config.ffn_dim
        close(neurons, activation, what="OPT's neurons are its activation")
        with torch.no_grad():
            fc1, act = layer._module.fc1, layer._module.activation_fn
            close(act(fc1(entering)), activation, what="activation_fn(fc1(mlp_input)) vs mlp_activation")
            close(layer.mlp._module(neurons), added, what="fc2(mlp_neurons) vs mlp_output")

    def test_an_mlp_write_in_one_invoke_lands_in_its_rows_only(self) -> None:
        """Two invokes share one flat tensor: a write in the second changes its own last token, not the first's."""
        model = self.model
        outputs = []
        with model.trace() as tracer:
            for prompt in BATCH:
                with tracer.invoke(prompt):
                    outputs.append(model.layers[0].layer_output.save())
        clean = [output.clone() for output in outputs]
        edited, parts = [], []
        with model.trace() as tracer:
            with tracer.invoke(BATCH[0]):
                edited.append(model.layers[0].layer_output.save())
            with tracer.invoke(BATCH[1]):
                layer = model.layers[0]
                entering = layer.layer_input.save()
                attention = layer.self_attn.attention_output.save()
                written = layer.mlp.mlp_output.clone()
                written[:, -1] = 3.0
                layer.mlp.mlp_output = written
                parts.append(written.save())
                edited.append(layer.layer_output.save())
        close(edited[0], clean[0], what="the first invoke's layer_output after a write in the second")
        before = len(model.tokenizer(BATCH[1]).input_ids) - 1
        assert not torch.allclose(edited[1][:, -1], clean[1][:, -1]), "the write did not reach the second invoke"
        close(edited[1][:, :before], clean[1][:, :before], what="the second invoke's earlier positions")
        if not self.model.layers[0].stream_norms():
            close(entering + attention + parts[0], edited[1], what="layer_output after writing mlp_output")


class TestOPT(FlatTokenChecks, family_suite("opt")):
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
            close(normed, block.self_attn_layer_norm(entering), what="attention_norm_output vs its norm of layer_input")
            close(mlp_normed, block.final_layer_norm(mid), what="mlp_norm_output vs final_layer_norm(layer_mid)")
        close(mlp_input, mlp_normed, what="mlp_input vs mlp_norm_output")

    def test_a_layer_mid_write_reaches_the_mlp_norm_and_the_residual(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            written = torch.randn_like(layer.layer_mid).save()
            layer.layer_mid = written
            received = layer.mlp_norm_output.save()
            added = layer.mlp.mlp_output.save()
            leaving = layer.layer_output.save()
        with torch.no_grad():
            close(received, layer._module.final_layer_norm(written), what="mlp_norm_output after assigning layer_mid")
        close(leaving, written + added, what="layer_output vs written layer_mid + mlp_output")

    def test_queries_come_scaled_and_the_scores_are_their_plain_product(self) -> None:
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            queries = attention.attention_queries.save()
            keys = attention.attention_keys.save()
            scores = attention.attention_scores.save()
        seq = scores.shape[-1]
        causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
        product = queries @ keys.transpose(-1, -2)
        close(scores[..., causal], product[..., causal], what="scores vs queries @ keys^T (no further scaling)")


class TestOPTPostNorm(FlatTokenChecks, LayerSuite, AttentionSuite):
    """OPT-350m's shape: norms after each addition, and embeddings projected in and out of a narrower width."""

    family = "opt"
    load = {"do_layer_norm_before": False, "word_embed_proj_dim": 16}

    def test_post_norm_block_has_no_pre_norm_outputs(self) -> None:
        support = self.model.support()
        every = range(self.model.num_layers)
        assert support["attention_norm_output"] == {layer: POST_NORM_ATTENTION for layer in every}
        assert support["mlp_norm_output"] == {layer: POST_NORM_MLP for layer in every}
        assert self.model.layers[0].stream_norms() == ("self_attn_layer_norm", "final_layer_norm")

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
            expected = layer._module.final_layer_norm(written + added)
        close(leaving, expected, what="layer_output vs final_layer_norm(written layer_mid + mlp_output)")
