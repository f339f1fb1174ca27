"""SelectiveScan's behaviour around the suite's properties: routing, mambapy, what can be written where."""

import sys

import pytest
import torch

from nnterp import Unavailable, route_kernels
from nnterp.testing import PROMPT, close, tiny_standardized
from nnterp_mamba.selective_scan import SelectiveScan
from nnterp_mamba.testing import selective_scan_reference

# These tests route and unroute the family around models they trace and drop; routing then warns about the
# dropped models the collector has not reached yet, as designed (test_values_inside_the_dispatcher checks it).
pytestmark = pytest.mark.filterwarnings(r"ignore:route_kernels\(\.\.\., '(torch|default)'\)")


@pytest.fixture
def routed():
    """A fresh tiny Mamba with its kernels routed to the pure-torch functions, restored afterwards."""
    model = tiny_standardized("mamba")
    route_kernels(model.family, "torch")
    yield model
    route_kernels(model.family, "default")


def test_states_need_routing_and_follow_it():
    model = tiny_standardized("mamba")
    assert model.support()["linear_attn.states"] == dict.fromkeys((0, 1), SelectiveScan.PER_TOKEN.hint)
    with pytest.raises(Unavailable, match="route_kernels"):
        with model.trace(PROMPT):
            model.layers[0].linear_attn.states.save()
    route_kernels(model.family, "torch")
    try:
        assert model.support()["linear_attn.states"] is None
    finally:
        route_kernels(model.family, "default")
    assert model.support()["linear_attn.states"] == dict.fromkeys((0, 1), SelectiveScan.PER_TOKEN.hint)


def test_values_inside_the_dispatcher_match_the_routed_ones():
    """Unrouted, the kernel body is one call deeper, behind transformers' hub dispatcher; the values are the same."""
    unrouted = tiny_standardized("mamba")
    with unrouted.trace(PROMPT):
        behind = unrouted.layers[1].linear_attn.attention_head_outputs.save()
        final = unrouted.layers[1].linear_attn.state_output.save()
    with pytest.warns(UserWarning, match="already traced"):
        route_kernels(unrouted.family, "torch")
    try:
        model = tiny_standardized("mamba")
        with model.trace(PROMPT):
            states = model.layers[1].linear_attn.states.save()
            direct = model.layers[1].linear_attn.attention_head_outputs.save()
    finally:
        route_kernels(unrouted.family, "default")
    close(behind, direct, what="attention_head_outputs behind the dispatcher vs routed")
    assert torch.equal(states[:, -1], final)


def test_mambapy_parallel_scan_has_no_per_token_state(routed, monkeypatch):
    mixer = routed.layers[0].linear_attn
    monkeypatch.setattr(mixer._module, "use_mambapy", True)
    monkeypatch.setattr(sys.modules[type(mixer._module).__module__], "is_mambapy_available", lambda: True)
    reason = routed.support(layer=0)["linear_attn.states"]
    assert reason is not None and "mambapy" in reason
    assert routed.support(layer=0)["linear_attn.state"] == reason
    with pytest.raises(Unavailable, match="mambapy"):
        with routed.trace(PROMPT):
            mixer.state_after(0).save()
    assert routed.support(layer=0)["linear_attn.attention_head_outputs"] is None


def test_in_place_edit_of_a_split_view_needs_no_grad(routed):
    mixer = routed.layers[0].linear_attn
    with pytest.raises(RuntimeError, match="view"):
        with routed.trace(PROMPT):
            mixer.attention_queries[:, -1] = 0
    with routed.trace(PROMPT):
        with torch.no_grad():
            mixer.attention_queries[:, -1] = 0
        edited = mixer.attention_head_outputs.save()
    with routed.trace(PROMPT):
        C = mixer.attention_queries
        mixer.attention_queries = torch.cat([C[:, :-1], torch.zeros_like(C[:, -1:])], dim=1)
        assigned = mixer.attention_head_outputs.save()
    close(edited, assigned, what="an in-place edit under no_grad vs an assignment")


def test_betas_assignment_says_it_is_derived(routed):
    with pytest.raises(AttributeError, match="betas is derived and read-only"):
        with routed.trace(PROMPT):
            routed.layers[0].linear_attn.betas = torch.zeros(1)


def test_state_input_is_none_on_a_prompt_and_cannot_be_written_there(routed):
    mixer = routed.layers[0].linear_attn
    seen = []
    with routed.trace(PROMPT):
        seen.append(mixer.state_input)
    assert seen == [None]
    with pytest.raises(ValueError, match="starts from zeros"):
        with routed.trace(PROMPT):
            mixer.state_input = torch.zeros(1, mixer.channels, mixer.state_dim)


def test_written_state_input_is_where_the_decode_step_starts(routed):
    mixer = routed.layers[0].linear_attn
    D = mixer._module.D.detach()
    written = torch.full((1, mixer.channels, mixer.state_dim), 0.5)
    step = {}
    with routed.generate(PROMPT, max_new_tokens=2, do_sample=False) as tracer:
        for _ in tracer.iter[1]:
            mixer.state_input = written
            step["x"] = mixer.attention_values.save()
            step["B"] = mixer.attention_keys.save()
            step["C"] = mixer.attention_queries.save()
            step["betas"] = mixer.betas.save()
            step["decays"] = mixer.decays.save()
            step["leaving"] = mixer.state_output.save()
            step["y"] = mixer.attention_head_outputs.save()
    states, y = selective_scan_reference(
        step["x"], step["betas"], step["decays"], step["B"], step["C"], D, state=written
    )
    close(step["leaving"], states[:, 0], what="state_output after writing state_input")
    close(step["y"], y, what="attention_head_outputs after writing state_input")


def test_a_decode_steps_states_are_its_one_update(routed):
    mixer = routed.layers[1].linear_attn
    saved = {}
    with routed.generate(PROMPT, max_new_tokens=3, do_sample=False) as tracer:
        for _ in tracer.iter[2]:
            saved["states"] = mixer.states.save()
            saved["leaving"] = mixer.state_output.save()
    assert tuple(saved["states"].shape) == (1, 1, mixer.channels, mixer.state_dim)
    assert torch.equal(saved["states"][:, 0], saved["leaving"])


def test_selective_scan_wraps_every_mamba_mixer():
    for family, mixers in (("mamba", [0, 1]), ("falcon_mamba", [0, 1]), ("jamba", [0, 2, 3])):
        model = tiny_standardized(family)
        found = [
            i for i, layer in enumerate(model.layers) if isinstance(getattr(layer, "linear_attn", None), SelectiveScan)
        ]
        assert found == mixers, f"{family}: SelectiveScan on blocks {found}, expected {mixers}"


def test_a_decode_steps_written_state_output_reaches_the_next_step_only(routed):
    mixer = routed.layers[0].linear_attn
    saved = {}
    with routed.generate(PROMPT, max_new_tokens=3, do_sample=False) as tracer:
        for _ in tracer.iter[1]:
            saved["clean_y"] = mixer.attention_head_outputs.save()
    with routed.generate(PROMPT, max_new_tokens=3, do_sample=False) as tracer:
        for _ in tracer.iter[1]:
            mixer.state_output = torch.full_like(mixer.state_output, 0.25)
            saved["y"] = mixer.attention_head_outputs.save()
        for _ in tracer.iter[2]:
            saved["entering"] = mixer.state_input.save()
    close(saved["y"], saved["clean_y"], what="the written step's own attention_head_outputs")
    close(saved["entering"], torch.full_like(saved["entering"], 0.25), what="the next step's state_input")


def test_the_plugin_adds_its_names_to_nnterp():
    import nnterp
    from nnterp_mamba.selective_scan import needs_token_loop

    assert nnterp.SelectiveScan is SelectiveScan
    assert nnterp.needs_token_loop is needs_token_loop
    assert nnterp.families.jamba.MODEL_TYPES == ("jamba",)


def test_state_output_of_a_prompt_run_without_a_cache_says_how_to_get_it():
    model = tiny_standardized("mamba")
    mixer = model.layers[0].linear_attn
    with pytest.raises(Unavailable, match="without a cache .*use_cache=True"):
        with model.trace(PROMPT, use_cache=False):
            mixer.state_output.save()


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no_cache"])
def test_a_prompt_run_from_its_arguments_is_the_kernels_run(use_cache):
    """run_from_arguments skips the kernel with what it returns, the last state with the output where a cache takes
    it, and returns the head outputs attention_head_outputs serves on the kernel's run; with gradients on it leaves
    the kernel to run."""
    model = tiny_standardized("mamba")
    mixers = [layer.linear_attn for layer in model.layers]
    runs: list[dict] = [{}, {}]
    for run, skipping in zip(runs, (False, True), strict=True):
        with torch.no_grad(), model.trace(PROMPT, use_cache=use_cache):
            run["heads"], run["last"] = [], []
            for mixer in mixers:
                heads = mixer.run_from_arguments() if skipping else mixer.attention_head_outputs
                run["heads"].append(heads.clone().save())
                if use_cache:
                    run["last"].append(mixer.state_output.save())
            run["logits"] = model.logits.save()
    kernel, skipped = runs
    close(skipped["logits"], kernel["logits"])
    for ours, theirs in zip(skipped["heads"] + skipped["last"], kernel["heads"] + kernel["last"], strict=True):
        close(ours, theirs)
    with model.trace(PROMPT):
        kernel["taken"] = [mixer.run_from_arguments() for mixer in mixers]
    assert kernel["taken"] == [None] * len(mixers)
