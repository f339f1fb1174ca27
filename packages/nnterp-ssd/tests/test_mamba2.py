"""Mamba-2: single-sublayer blocks, every mixer a Mamba-2 one; and what the plugin adds to nnterp."""

import pytest

import nnterp
from nnterp.testing import LayerSuite, tiny_standardized
from nnterp_ssd import StateSpace, chunk_per_token
from nnterp_ssd.families import mamba2
from nnterp_ssd.testing import SSDSuite


class TestMamba2(LayerSuite, SSDSuite):
    family = "mamba2"

    def test_plugin_adds_the_family_and_chunk_per_token(self) -> None:
        assert nnterp.families.mamba2 is mamba2
        assert self.model.family is mamba2
        assert nnterp.chunk_per_token is chunk_per_token
        assert all(isinstance(layer.linear_attn, StateSpace) for layer in self.model.layers)


def test_chunk_per_token_needs_a_mamba2_mixer() -> None:
    with pytest.raises(ValueError, match="no Mamba-2 \\(StateSpace\\) mixer"):
        chunk_per_token(tiny_standardized("llama"))
