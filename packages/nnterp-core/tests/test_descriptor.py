import pytest
import torch
from nnsight.intervention.source import SourceNotAvailable

from nnterp import DerivedEProperty, EProperty, Layer, Unavailable, axis_size, unavailable
from nnterp.layouts import HIDDEN, Residual
from nnterp.testing import PROMPT, close


def forward_calls(module):
    calls = []
    handle = module.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle


class Probe(Layer):
    """A block envoy with values on every kind of path, to test the descriptor itself."""

    sourced = True  # mlp_call is read after mlp_argument, from inside the block's forward

    @EProperty("../0.output")
    def first_block_output(self, value) -> Residual:
        """The first block's output, by a path through the parent."""
        return value

    @EProperty("/embed_tokens.output")
    def embeddings(self, value) -> Residual:
        """The embeddings, by a path from the root."""
        return value

    @EProperty("mlp.inputs", select=0)
    def mlp_argument(self, value) -> Residual:
        """The MLP's first positional argument."""
        return value

    @EProperty("source.self_mlp_0.output")
    def mlp_call(self, value) -> Residual:
        """The MLP call inside the block's forward."""
        return value

    @EProperty("source.no_such_op_0.output")
    def missing_operation(self, value):
        return value

    @EProperty("no_such_module.output")
    def missing_module(self, value):
        return value

    gone = unavailable("this block has no such thing")

    @DerivedEProperty
    def doubled(self) -> Residual:
        """Twice the block's output."""
        return self.layer_output * 2


@pytest.fixture
def probed(core_plugin):
    from transformers.models.olmo.modeling_olmo import OlmoDecoderLayer

    from nnterp import StandardizedTransformer
    from nnterp.testing import local_tokenizer, tiny_model

    return StandardizedTransformer(
        tiny_model("olmo"), tokenizer=local_tokenizer(), envoys={**core_plugin.ENVOYS, OlmoDecoderLayer: Probe}
    )


def test_paths_reach_the_same_tensors_as_nnsight(probed):
    block = probed.layers[1]
    with probed.trace(PROMPT):
        embeddings = block.embeddings.save()
        native_embeddings = probed.model.embed_tokens.output.save()
        first = block.first_block_output.save()
        argument = block.mlp_argument.save()
        native_mlp = probed.model.layers[1].mlp.output.save()
        call = block.mlp_call.save()
    assert embeddings is native_embeddings or torch.equal(embeddings, native_embeddings)
    assert first.shape == embeddings.shape
    assert argument.shape == embeddings.shape
    close(call, native_mlp, what="the mlp call inside the forward vs the mlp's output")


def test_assignment_through_a_selected_argument_reaches_the_module(probed):
    block = probed.layers[0]
    with probed.trace(PROMPT):
        block.mlp_argument = torch.zeros_like(block.mlp_argument)
        received = block.mlp_input.save()
    assert torch.count_nonzero(received) == 0


def test_derived_value_is_computed_and_read_only(probed):
    block = probed.layers[0]
    with probed.trace(PROMPT):
        doubled = block.doubled.save()
        output = block.layer_output.save()
    close(doubled, output * 2, what="doubled")
    with pytest.raises(AttributeError, match="doubled is derived and read-only"):
        with probed.trace(PROMPT):
            block.doubled = torch.zeros(1)


def test_unavailable_raises_before_the_model_runs(probed):
    calls, handle = forward_calls(probed.layers[0]._module)
    try:
        with pytest.raises(Unavailable, match=r"gone on layers\[0\]: this block has no such thing"):
            with probed.trace(PROMPT):
                probed.layers[0].gone.save()
    finally:
        handle.remove()
    assert calls == []
    assert probed.support(layer=0)["gone"] == "this block has no such thing"


def test_missing_module_and_operation_name_the_problem(probed):
    with pytest.raises(Unavailable, match="no no_such_module module on model.model.layers.0"):
        with probed.trace(PROMPT):
            probed.layers[0].missing_module.save()
    with pytest.raises(SourceNotAvailable, match="no operation 'no_such_op_0'; available: .*self_mlp_0"):
        with probed.trace(PROMPT):
            probed.layers[0].missing_operation.save()


def test_read_outside_a_trace_says_where_to_read(model):
    with pytest.raises(ValueError, match=r"layer_output on layers\[0\] is a value of the running model"):
        model.layers[0].layer_output


def test_layout_dims_and_repr_line():
    value = Layer.layer_output
    assert value.layout is Residual
    assert value.dims == ("batch", "seq", "hidden_size")
    assert str(value).startswith("(layer_output) -> Residual [batch, seq, hidden_size]: The residual stream leaving")
    assert isinstance(torch.zeros(1, 2, 3), value.layout)
    assert not value.is_operation()
    assert Probe.mlp_call.is_operation()


def test_axis_size_walks_up_to_the_root(model):
    assert axis_size(model.layers[0], HIDDEN) == model.hidden_size == 32
    with pytest.raises(ValueError, match="declares the size of axis 'batch'"):
        axis_size(model.layers[0], "batch")


def test_repr_lists_values_with_layouts(model):
    text = repr(model)
    assert "(layer_output) -> Residual [batch, seq, hidden_size]" in text
    assert "(mlp_neurons) -> Neurons [batch, seq, intermediate_size]" in text
