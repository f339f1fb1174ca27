"""``lightning_states`` against the recurrence run token by token in float64, on every path it takes."""

import pytest
import torch

from nnterp.testing import close
from nnterp_lightning.recurrence import CHUNK, lightning_states
from nnterp_lightning.testing import lightning_reference


@pytest.mark.parametrize("entering", [False, True])
@pytest.mark.parametrize("chosen", ["every", "most", "few"])
def test_states_are_the_float64_recurrence(entering: bool, chosen: str) -> None:
    """Every position (the scan, returned as it is), most of them (the scan, indexed), a few (the chunks)."""
    generator = torch.Generator().manual_seed(0)
    batch, seq, heads, key_dim, value_dim = 2, 2 * CHUNK + 13, 3, 5, 4
    keys = torch.randn(batch, seq, heads, key_dim, generator=generator)
    values = torch.randn(batch, seq, heads, value_dim, generator=generator)
    slopes = torch.tensor([0.02, 0.3, 1.5])
    state = torch.randn(batch, heads, key_dim, value_dim, generator=generator) if entering else None
    positions = {
        "every": torch.arange(seq),
        "most": torch.arange(1, seq),
        "few": torch.tensor([0, CHUNK - 1, CHUNK, seq - 1]),
    }[chosen]
    decays = (-slopes).expand(batch, seq, heads)
    expected, _ = lightning_reference(torch.zeros_like(keys), keys, values, decays, state)
    states = lightning_states(keys, values, slopes, state, positions, torch.float32)
    scale = expected.abs().max().item()
    close(states, expected[:, positions], 1e-6 * scale, f"{chosen} states vs the float64 recurrence")
