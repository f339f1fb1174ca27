import inspect

import pytest
import torch
from nnsight.intervention.source import SourceNotAvailable

from nnterp import DerivedEProperty, EProperty, Layer, Unavailable, axis_size, unavailable
from nnterp.layouts import HIDDEN, Residual
from nnterp.testing import PROMPT, close
from nnterp.value_paths import BoundArgument


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


def rule(query, key, g, beta, chunk_size=64, initial_state=None, output_final_state=False, **kwargs):
    """A kernel-shaped function: what it returns shows which arguments it received."""
    start = 0.0 if initial_state is None else initial_state
    return query * key + g * beta + start + chunk_size + len(kwargs)


@pytest.mark.parametrize(
    "call",
    [
        ((1.0, 2.0, 3.0, 4.0), {"initial_state": 5.0}),
        ((1.0, 2.0), {"g": 3.0, "beta": 4.0, "initial_state": 5.0}),
        ((), {"query": 1.0, "key": 2.0, "g": 3.0, "beta": 4.0, "initial_state": 5.0}),
        ((1.0, 2.0, 3.0, 4.0, 64, 5.0), {}),
    ],
    ids=["keyword state", "keyword gates", "all keywords", "all positional"],
)
def test_a_bound_argument_is_found_and_replaced_wherever_the_call_passes_it(call):
    """Every spelling of one call reads the same arguments, and a replacement reaches the function as that argument."""
    signature = inspect.signature(rule)
    expected = rule(*call[0], **call[1])
    for name, value in (("g", 3.0), ("beta", 4.0), ("initial_state", 5.0), ("chunk_size", 64)):
        assert BoundArgument(signature, name).pick(call) == value, name
    args, kwargs = BoundArgument(signature, "beta").place(call, 40.0)
    assert rule(*args, **kwargs) == expected + 3.0 * 36.0
    args, kwargs = BoundArgument(signature, "initial_state").place(call, None)
    assert rule(*args, **kwargs) == expected - 5.0


def test_a_bound_argument_reads_defaults_and_kwargs_and_refuses_a_parameter_the_function_lacks():
    signature = inspect.signature(rule)
    call = ((1.0, 2.0, 3.0, 4.0), {"use_qk_l2norm_in_kernel": True})
    assert BoundArgument(signature, "output_final_state").pick(call) is False
    assert BoundArgument(signature, "use_qk_l2norm_in_kernel").pick(call) is True
    assert BoundArgument(signature, "state").pick(call) is None
    with pytest.raises(TypeError, match="no parameter 'state'"):
        BoundArgument(signature, "state").place(call, 1.0)


def test_a_value_declared_on_a_class_that_is_no_host_is_refused_when_the_class_is_made():
    """A standard value asks its envoy about order and presence; a class that cannot answer is refused at once."""
    from nnsight.intervention.envoy import Envoy

    with pytest.raises(RuntimeError) as raised:

        class Homeless(Envoy):
            @EProperty("output")
            def stream(self, value) -> Residual:
                return value

    assert "derive Homeless from nnterp.value_host.ValueHost" in str(raised.value.__cause__)
