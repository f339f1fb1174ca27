"""The analyses on every Mamba-1 family: knockout from the cache equals whole runs, and attribution estimates each
value a family has or says why not."""

import pytest
import torch

from nnterp import Unavailable
from nnterp.analysis import attribution_patch, knock_out, knockout
from nnterp.analysis.attribution import ESTIMATED
from nnterp.testing import PROMPT, mild_decays, tiny_standardized

#: Zamba with two Mamba heads as well: a scan call per head.
FAMILIES = ("mamba", "falcon_mamba", "jamba", "zamba", ("zamba", {"n_mamba_heads": 2}))
CORRUPT = "Hexxo wirld, thera"


@pytest.fixture(scope="module", params=FAMILIES, ids=str)
def model(request):
    name, config = request.param if isinstance(request.param, tuple) else (request.param, {})
    return mild_decays(tiny_standardized(name, **config))


def test_knockout_equals_knocking_out_in_whole_runs(model):
    positions = [0, 9, 14]
    shared = knockout(model, PROMPT, positions, metric=lambda logits: logits.float(), batch_size=2)
    read = []
    with torch.no_grad(), model.trace(PROMPT):
        read.append(model.logits.save())
    for position in positions:
        with torch.no_grad(), model.trace(PROMPT):
            knock_out(model, [position])
            read.append(model.logits.save())
    clean, *knocked = read
    for change, alone, position in zip(shared, knocked, positions, strict=True):
        torch.testing.assert_close(change, (alone - clean)[0].float(), rtol=1e-4, atol=1e-5, msg=f"position {position}")


@pytest.mark.parametrize("value", ESTIMATED)
def test_attribution_estimates_each_value_or_says_why_not(model, value):
    try:
        estimate = attribution_patch(model, PROMPT, CORRUPT, values=[value])[value]
    except Unavailable as error:
        assert "no chosen block serves" in str(error) or "no gradient" in str(error) or "does not say" in str(error)
        return
    assert estimate.scores.shape[:2] == (len(estimate.layers), len(PROMPT))
    assert torch.isfinite(estimate.scores).all() and estimate.scores.abs().max() > 0


def test_zambas_states_are_refused_before_the_model_runs():
    """Zamba calls the scan once per head on slices of stacked tensors: its states declare no adjoint of one call."""
    model = tiny_standardized("zamba", n_mamba_heads=2)
    with pytest.raises(Unavailable, match=r"does not say how its states' gradient runs back"):
        attribution_patch(model, PROMPT, CORRUPT, values=["linear_attn.states"])
