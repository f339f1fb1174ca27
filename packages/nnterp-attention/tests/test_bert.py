import torch

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP
from nnterp.testing import PROMPT, AttentionSuite, LayerSuite, close


class TestBert(LayerSuite, AttentionSuite):
    family = "bert"

    def test_post_norm_block_has_no_pre_norm_outputs(self) -> None:
        support = self.model.support()
        every = range(self.model.num_layers)
        assert support["attention_norm_output"] == {layer: POST_NORM_ATTENTION for layer in every}
        assert support["mlp_norm_output"] == {layer: POST_NORM_MLP for layer in every}

    def test_a_layer_mid_write_reaches_the_mlp_and_its_residual(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            written = torch.randn_like(layer.layer_mid)
            layer.layer_mid = written
            received = layer.mlp_input.save()
            added = layer.mlp.mlp_output.save()
            leaving = layer.layer_output.save()
        close(received, written, what="mlp_input after assigning layer_mid")
        with torch.no_grad():
            expected = layer._module.output.LayerNorm(written + added)
        close(leaving, expected, what="layer_output vs output.LayerNorm(written layer_mid + mlp_output)")

    def test_mlp_neurons_are_the_down_projections_input(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            activation = layer.mlp.mlp_activation.save()
            neurons = layer.mlp.mlp_neurons.save()
            added = layer.mlp.mlp_output.save()
        assert neurons.shape[-1] == layer.mlp.intermediate_size == self.model._module.config.intermediate_size
        close(neurons, activation, what="BERT's neurons are its activation")
        with torch.no_grad():
            close(layer._module.output.dense(neurons), added, what="output.dense(mlp_neurons) vs mlp_output")


class TestBertGeneration(LayerSuite, AttentionSuite):
    family = "bert_generation"


class TestCamembert(LayerSuite, AttentionSuite):
    family = "camembert"


class TestData2VecText(LayerSuite, AttentionSuite):
    family = "data2vec_text"


class TestElectra(LayerSuite, AttentionSuite):
    family = "electra"


class TestErnie(LayerSuite, AttentionSuite):
    family = "ernie"


class TestRoberta(LayerSuite, AttentionSuite):
    family = "roberta"


class TestRoCBert(LayerSuite, AttentionSuite):
    family = "roc_bert"


class TestXLMRoberta(LayerSuite, AttentionSuite):
    family = "xlm_roberta"
