"""The analyses on every Mamba-1 family: knockout from the cache equals whole runs, and attribution estimates each
value a family has or says why not."""

import pytest
import torch

from nnterp import Unavailable
from nnterp.analysis import attribution_patch, causal_trace, knock_out, knockout, patch_state
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


def whole(logits):
    return logits.float()


def test_patching_its_own_state_changes_nothing_and_another_prompts_moves_only_later_tokens(model):
    """Zamba's shared attention runs before its Mamba mixer in a block: what patching reads and writes follows."""
    own = patch_state(model, PROMPT, PROMPT, [2, 5], metric=whole)
    assert own.abs().max() <= 1e-4, f"patching its own state changed the target by {own.abs().max():.2e}"
    moved = patch_state(model, "Nothing alike, truly", PROMPT, [2, 5], metric=whole)
    for change, t in zip(moved, [2, 5], strict=True):
        assert change[:t].abs().max() <= 1e-5, "a patch after t changed a token before t"
        assert change[t:].abs().max() > 1e-6, "patching another prompt's state changed nothing"


def test_restoring_the_last_blocks_last_stream_gives_the_clean_answer(model):
    """Row by row in forward order, Zamba's attention first: the stream restored at the last block's last position is
    the clean run's, and the mixers' outputs are restored too."""
    trace = causal_trace(model, PROMPT, PROMPT[3:6], values=["layer_output", "attention_output"])
    assert trace.scores[0, -1, -1].item() == pytest.approx(trace.clean, abs=1e-6)
    assert trace.clean != pytest.approx(trace.corrupted, abs=1e-6), "the noise changed nothing: nothing checked"
    assert torch.isfinite(trace.scores).all()
