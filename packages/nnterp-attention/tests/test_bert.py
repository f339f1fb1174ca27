"""BERT and the families that copy its block: post-norm (BERT's own), pre-norm, and the attention before the shared interface."""

from operator import attrgetter

import torch

from nnterp import POST_NORM_ATTENTION, POST_NORM_MLP
from nnterp.testing import PROMPT, AttentionSuite, LayerSuite, close
from nnterp_attention.testing import AlibiAttentionSuite


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


class TestBert(PostNormBertChecks, LayerSuite, AttentionSuite):
    family = "bert"


class TestBertGeneration(PostNormBertChecks, LayerSuite, AttentionSuite):
    family = "bert_generation"


class TestCamembert(PostNormBertChecks, LayerSuite, AttentionSuite):
    family = "camembert"


class TestData2VecText(PostNormBertChecks, LayerSuite, AttentionSuite):
    family = "data2vec_text"


class TestElectra(PostNormBertChecks, LayerSuite, AttentionSuite):
    family = "electra"


class TestErnie(PostNormBertChecks, LayerSuite, AttentionSuite):
    family = "ernie"


class TestRoberta(PostNormBertChecks, LayerSuite, AttentionSuite):
    family = "roberta"


class TestRoCBert(PostNormBertChecks, LayerSuite, AttentionSuite):
    family = "roc_bert"


class TestXLMRoberta(PostNormBertChecks, LayerSuite, AttentionSuite):
    family = "xlm_roberta"


class TestRemBert(PostNormBertChecks, LayerSuite, AlibiAttentionSuite):
    family = "rembert"


class TestBigBird(PostNormBertChecks, LayerSuite, AlibiAttentionSuite):
    family = "big_bird"


class TestGit(PostNormBertChecks, LayerSuite, AlibiAttentionSuite):
    family = "git"


class TestRoFormer(PostNormBertChecks, LayerSuite, AlibiAttentionSuite):
    family = "roformer"


class TestMegatronBert(PreNormBertChecks, LayerSuite, AlibiAttentionSuite):
    family = "megatron_bert"


class TestRobertaPreLayerNorm(PreNormBertChecks, LayerSuite, AttentionSuite):
    family = "roberta_prelayernorm"


class TestXLMRobertaXL(PreNormBertChecks, LayerSuite, AttentionSuite):
    family = "xlm_roberta_xl"
