"""Zamba: Mamba-1 blocks around hybrid blocks whose shared transformer feeds their mixer."""

import pytest

from nnterp import Unavailable
from nnterp.testing import PROMPT, AttentionSuite, LayerSuite, close, tiny_standardized
from nnterp_mamba.testing import SelectiveScanSuite


class TestZamba(LayerSuite, AttentionSuite, SelectiveScanSuite):
    family = "zamba"


def test_a_scan_called_once_per_head_is_refused_not_served_as_its_first_head() -> None:
    """Two Mamba heads are two scan calls per forward: the scan's values say so; the mixer's output is still served."""
    model = tiny_standardized("zamba", n_mamba_heads=2)
    block = model.layers[0]
    support = model.support(layer=0)
    for value in ("attention_values", "attention_queries", "state_output", "states", "state_trajectory"):
        reason = support[f"linear_attn.{value}"]
        assert reason is not None and "once per head (n_mamba_heads=2)" in reason, f"{value}: {reason!r}"
    with pytest.raises(Unavailable, match=r"attention_values on layers\[0\]\.linear_attn: .* once per head"):
        with model.trace(PROMPT):
            block.linear_attn.attention_values.save()
    with pytest.raises(Unavailable, match=r"token_mixing on layers\[0\]\.linear_attn: .* once per head"):
        with model.trace(PROMPT):
            block.linear_attn.token_mixing().save()
    with model.trace(PROMPT):
        entering = block.layer_input.save()
        added = block.linear_attn.attention_output.save()
        leaving = block.layer_output.save()
    close(entering + added, leaving, what="layer_input + linear_attn.attention_output with two Mamba heads")
