"""BERT and the families that copy its block: post-norm (BERT's own), pre-norm, and the attention before the shared interface."""

from operator import attrgetter

import torch

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP
from nnterp.testing import PROMPT, close, family_suite


class PostNormBertChecks:
    """BERT's block: no pre-norms, and a stream between the sublayers that both the MLP and its residual read."""

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
            expected = attrgetter(layer.stream_norms()[-1])(layer._module)(written + added)
        close(leaving, expected, what="layer_output vs the second norm of (written layer_mid + mlp_output)")

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


class PreNormBertChecks:
    """A pre-norm copy: the norms read the stream, and a layer_mid write reaches the MLP's norm and the residual."""

    def test_pre_norms_read_the_stream_and_layer_mid_reaches_both(self) -> None:
        layer = self.model.layers[0]
        attention_norm = attrgetter(type(layer).ATTENTION_NORM)(layer)._module
        mlp_norm = attrgetter(type(layer).MLP_NORM)(layer)._module
        with self.model.trace(PROMPT):
            entering = layer.layer_input.save()
            normed = layer.attention_norm_output.save()
            mid = layer.layer_mid.save()
            mlp_normed = layer.mlp_norm_output.save()
        with torch.no_grad():
            close(normed, attention_norm(entering), what="attention_norm_output vs the attention's norm of layer_input")
            close(mlp_normed, mlp_norm(mid), what="mlp_norm_output vs the MLP's norm of layer_mid")
        with self.model.trace(PROMPT):
            written = torch.randn_like(layer.layer_mid).save()
            layer.layer_mid = written
            received = layer.mlp_norm_output.save()
            added = layer.mlp.mlp_output.save()
            leaving = layer.layer_output.save()
        with torch.no_grad():
            close(received, mlp_norm(written), what="mlp_norm_output after assigning layer_mid")
        close(leaving, written + added, what="layer_output vs written layer_mid + mlp_output")


class TestBert(PostNormBertChecks, family_suite("bert")):
    pass


class TestBertGeneration(PostNormBertChecks, family_suite("bert_generation")):
    pass


class TestCamembert(PostNormBertChecks, family_suite("camembert")):
    pass


class TestData2VecText(PostNormBertChecks, family_suite("data2vec_text")):
    pass


class TestElectra(PostNormBertChecks, family_suite("electra")):
    pass


class TestErnie(PostNormBertChecks, family_suite("ernie")):
    pass


class TestRoberta(PostNormBertChecks, family_suite("roberta")):
    pass


class TestRoCBert(PostNormBertChecks, family_suite("roc_bert")):
    pass


class TestXLMRoberta(PostNormBertChecks, family_suite("xlm_roberta")):
    pass


class TestRemBert(PostNormBertChecks, family_suite("rembert")):
    pass


class TestBigBird(PostNormBertChecks, family_suite("big_bird")):
    pass


class TestGit(PostNormBertChecks, family_suite("git")):
    pass


class TestRoFormer(PostNormBertChecks, family_suite("roformer")):
    pass


class TestMegatronBert(PreNormBertChecks, family_suite("megatron_bert")):
    pass


class TestRobertaPreLayerNorm(PreNormBertChecks, family_suite("roberta_prelayernorm")):
    pass


class TestXLMRobertaXL(PreNormBertChecks, family_suite("xlm_roberta_xl")):
    pass
