"""Fixtures the cross-package tests share."""

import pytest

from nnterp import StandardizedTransformer
from nnterp.testing import save_tiny


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> StandardizedTransformer:
    """A tiny Llama with eager attention, saved to a directory and loaded back by path, once per test module."""
    directory = save_tiny("llama", tmp_path_factory.mktemp("llama") / "model")
    return StandardizedTransformer(directory, attn_implementation="eager")
