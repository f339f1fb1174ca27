"""Mamba-2: single-sublayer blocks, every mixer a Mamba-2 one; and what the plugin adds to nnterp."""

import pytest

import nnterp
from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT, ForwardChangeSuite, family_suite, save_tiny, tiny_standardized
from nnterp.testing.recurrent import close_relative
from nnterp_ssd import StateSpace, chunk_per_token
from nnterp_ssd.families import mamba2


class TestMamba2(family_suite("mamba2"), ForwardChangeSuite):
    def test_plugin_adds_the_family_and_chunk_per_token(self) -> None:
        assert nnterp.families.mamba2 is mamba2
        assert self.model.family is mamba2
        assert nnterp.chunk_per_token is chunk_per_token
        assert all(isinstance(layer.linear_attn, StateSpace) for layer in self.model.layers)


def test_chunk_per_token_needs_a_mamba2_mixer() -> None:
    with pytest.raises(ValueError, match="no Mamba-2 \\(StateSpace\\) mixer"):
        chunk_per_token(tiny_standardized("llama"))


def test_chunk_per_token_applies_to_a_model_loaded_by_path(tmp_path) -> None:
    """A model loaded by path is on meta modules until its first trace replaces them: the setting must reach the real ones."""
    model = StandardizedTransformer(save_tiny("mamba2", tmp_path))
    chunk_per_token(model)
    assert model.support(layer=0)["linear_attn.states"] is None, model.support(layer=0)["linear_attn.states"]
    read = []
    with model.trace(PROMPT):
        for layer in model.layers:
            read.extend((layer.linear_attn.states.save(), layer.linear_attn.state_trajectory.save()))
    for layer, (states, trajectory) in enumerate(zip(read[::2], read[1::2], strict=True)):
        close_relative(states, trajectory, f"layers[{layer}] states vs state_trajectory", tolerance=1e-5)
    assert model.support()["linear_attn.states"] is None
