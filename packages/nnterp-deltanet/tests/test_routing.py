"""Routing by name and through the nnterp namespace, and what it refuses."""

import pytest

import nnterp
from nnterp.components.routing import STASH
from nnterp.forward_source import callee
from nnterp_deltanet.families import qwen3_5_text


def test_route_delta_rule_is_in_the_nnterp_namespace_and_restores_the_import_time_kernels():
    modeling = qwen3_5_text.MODELING
    imported = (modeling.torch_chunk_gated_delta_rule, modeling.torch_recurrent_gated_delta_rule)
    nnterp.route_delta_rule(nnterp.families.qwen3_5_text, "recurrent")
    try:
        token_loop = callee(imported[1]).torch_function
        assert modeling.torch_chunk_gated_delta_rule is token_loop
        assert modeling.torch_recurrent_gated_delta_rule is token_loop
        nnterp.route_kernels(qwen3_5_text, "torch")  # routing twice keeps the import-time kernels to restore
        assert getattr(modeling, STASH)["torch_chunk_gated_delta_rule"] is imported[0]
    finally:
        nnterp.route_delta_rule(qwen3_5_text, "chunked")
    assert (modeling.torch_chunk_gated_delta_rule, modeling.torch_recurrent_gated_delta_rule) == imported
    assert not hasattr(modeling, STASH)


def test_a_family_without_recurrent_mixers_is_refused_naming_those_with_one():
    with pytest.raises(ValueError, match="families with one: .*qwen3_5_text"):
        nnterp.route_kernels(nnterp.families.llama, "torch")
