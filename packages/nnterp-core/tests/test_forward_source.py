"""ForwardSource: the labels are nnsight's, and an operation is found by what it is."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from nnsight.intervention.source import compiled, decorator_chain

from nnterp.forward_source import (
    FUNCTION,
    HUB_MODULE,
    Binding,
    Call,
    ForwardSource,
    NotInForward,
    Place,
    callee,
    hub_kernels,
)

#: Modeling modules whose every function and forward is read: the recurrent families' and a few attention ones'.
MODULES = ("qwen3_5", "qwen3_next", "mamba", "mamba2", "zamba", "falcon_h1", "kimi_linear", "llama", "gpt2", "bamba")


def functions_of(name: str) -> list:
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    found = []
    for value in vars(module).values():
        if inspect.isclass(value) and value.__module__ == module.__name__ and "forward" in vars(value):
            found.append(value.forward)
        elif callable(value) and getattr(value, "__module__", None) == module.__name__:
            body = callee(value).torch_function
            if inspect.isfunction(body):
                found.append(body)
    return found


@pytest.mark.parametrize("name", MODULES)
def test_labels_are_nnsights(name):
    """Every operation label, in order, is the one nnsight's own instrumentation gives the same function."""
    checked = 0
    for function in functions_of(name):
        expected = compiled(decorator_chain(function)[0]).names
        assert tuple(op.label for op in ForwardSource.of(function).operations) == expected, function.__qualname__
        checked += 1
    assert checked > 5, f"only {checked} functions of modeling_{name} were read"


def sample(x, cache, flag):
    state = x * 2
    if cache is not None and flag:
        out = torch.relu(state)
    else:
        for step in range(3):
            state = state + step
        out = torch.relu(torch.tanh(state))
    state.copy_(out.to(torch.float32))
    return out


def test_where_each_operation_sits():
    source = ForwardSource.of(sample)
    relu_taken, relu_else = source.calls("torch.relu")
    assert relu_taken.arms[0].taken and relu_taken.arms[0].test == "cache is not None and flag"
    assert not relu_else.arms[0].taken and not relu_else.loops
    assert relu_else.within is None and source.calls("torch.tanh")[0].within == "torch.relu"
    looped = Binding("state", loop=True).find(source)
    assert looped.loops[0].header == "for step in range(3)" and looped.loops[0].iterable == ("range_0",)
    assert Binding("state").find(source).label == looped.label  # the last binding of the name
    assert Binding("state", first=True).find(source) is source.bindings("state")[0] != looped
    assert Binding("out", under="cache is not None").find(source) is source.bindings("out")[0]
    assert Call("out.to", within="state.copy_").find(source).label == "out_to_0"


def test_a_missing_or_ambiguous_operation_says_what_was_found():
    source = ForwardSource.of(sample)
    with pytest.raises(NotInForward, match="one call of `torch.relu`.*found: line"):
        Call("torch.relu").find(source)
    with pytest.raises(NotInForward, match="a binding of `missing`.*none"):
        Binding("missing").find(source)


def test_what_a_name_is_bound_to():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    bound = modeling.torch_chunk_gated_delta_rule
    found = callee(bound)
    assert found.torch_function.__name__ == "torch_chunk_gated_delta_rule"
    assert found.how in (FUNCTION, HUB_MODULE)
    assert found.how == HUB_MODULE or found.function is bound
    assert found.implementation is found.torch_function  # no optimized package here
    forward = ForwardSource.of(modeling.Qwen3_5GatedDeltaNet.forward)
    (call,) = forward.calls_to(bound)
    assert call.called == "torch_chunk_gated_delta_rule"
    assert forward.resolve("torch_chunk_gated_delta_rule") is bound
    assert callee(len).function is len and callee(len).how == FUNCTION


def test_hub_kernels_a_modeling_module_declares():
    from transformers.models.mamba2 import modeling_mamba2

    declared = {(kernel, package) for _, kernel, package in hub_kernels(modeling_mamba2)}
    assert ("mamba_chunk_scan_combined", "mamba_ssm") in declared
    assert ("selective_state_update", "mamba_ssm") in declared


def test_a_place_is_found_in_the_hosts_forward_and_says_when_it_is_not():
    class Host(torch.nn.Module):
        def forward(self, x):
            hidden = x + 1
            hidden = hidden * 2
            return hidden

    envoy = type("Envoy", (), {"_module": Host(), "parent": None})()
    assert Place(Binding("hidden"))(envoy) == "source.hidden_1.output"
    assert Place(Binding("hidden"), "input")(envoy) == "source.hidden_1.input"
    assert Place(Binding("hidden")).reason(envoy) is None
    reason = Place(Binding("gone")).reason(envoy)
    assert "Host's forward in this transformers does not hold it: expected a binding of `gone`" in reason
    parent = type("Envoy", (), {"_module": Host(), "parent": envoy})()
    assert Place(Binding("hidden"), module="..")(parent) == "../source.hidden_1.output"
