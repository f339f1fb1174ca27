"""Knockout and state patching on an attention model, a gated DeltaNet hybrid, a Mamba-1 and a Mamba-2, built on the
standard values and checked against what the recurrence itself says."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import nnterp_mamba.selective_scan
from nnterp import REGISTRY, route_kernels
from nnterp.analysis import knock_out, knockout, mixed, patch_state
from nnterp.analysis.blocks import mixers
from nnterp.analysis.continuation import continuation_inputs, continue_mixers, expanded, run_in_segments
from nnterp.components.per_token import TORCH_SCAN_CHUNK
from nnterp.forward_source import NotInForward
from nnterp.testing import PROMPT, blocks_with, mild_decays, tiny_standardized
from nnterp_deltanet.testing import reference_delta_rule

FAMILIES = ("llama", "qwen3_next", "mamba", "mamba2")
#: A prompt sharing PROMPT's first six tokens ("Hello "; the local tokenizer's tokens are characters) and none after,
#: and one sharing none.
SAME_START, OTHER = "Hello frog, anyone", "Nothing alike, truly"


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return mild_decays(tiny_standardized(request.param))


def whole(logits):
    return logits.float()


def test_knockout_leaves_every_earlier_token_and_changes_the_knocked_ones(model):
    seq = len(model.tokenizer(PROMPT).input_ids)
    positions = [2, seq - 3]
    changes = knockout(model, PROMPT, positions, metric=whole, batch_size=1)
    assert changes.shape == (2, seq, model.vocab_size)
    for change, position in zip(changes, positions, strict=True):
        assert change[:position].abs().max() <= 1e-5, f"knocking out {position} changed an earlier token"
        # a tiny Mamba writes little into its state next to its skip term D x: changes of 1e-5 are real ones
        assert change[position + 1 :].abs().max() > 1e-6, f"knocking out {position} changed no later token"


def test_a_batch_of_prompts_or_positions_outside_the_prompt_raise_before_the_model_runs():
    model = tiny_standardized("llama")
    calls: list = []
    hook = model._module.get_input_embeddings().register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(TypeError, match="one row of token ids"):
            knockout(model, ["Hello", "world"], [0])
        with pytest.raises(TypeError, match="one row of token ids"):
            patch_state(model, PROMPT, torch.zeros(2, 5, dtype=torch.long), [0])
        with pytest.raises(IndexError, match=r"positions \[40\] are outside the 18 tokens of the prompt"):
            knockout(model, PROMPT, [40])
        with pytest.raises(IndexError, match=r"layers \[7\] are outside the 2 blocks"):
            knockout(model, PROMPT, [1], layers=[7])
        with pytest.raises(IndexError, match=r"positions \[17\]: patching after token t needs"):
            patch_state(model, PROMPT, PROMPT, [17])
        with pytest.raises(IndexError, match=r"positions \[40\] are outside the 18 tokens of the target"):
            patch_state(model, PROMPT, PROMPT, [40])
    finally:
        hook.remove()
    assert not calls, "the model ran before the bad input was refused"


def test_a_block_without_a_sequence_mixer_is_refused_by_name():
    """Asked for by name, a block an analysis cannot touch raises rather than leave the run as it was."""
    block_without, block_with = SimpleNamespace(), SimpleNamespace(self_attn="attention")
    model = SimpleNamespace(layers=[block_with, block_without])
    assert [block.layer for block in mixers(model)] == [0]
    with pytest.raises(ValueError, match=r"layers\[1\] has no sequence mixer"):
        mixers(model, [1])


def test_knockout_batches_as_it_runs_one_at_a_time(model):
    positions = [1, 3, 4]
    together = knockout(model, PROMPT, positions, batch_size=3)
    alone = knockout(model, PROMPT, positions, batch_size=1)
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-5)


def test_knockout_sharing_the_start_equals_knocking_out_in_whole_runs(model):
    """Rows continue from the cache of the tokens before their first knocked one; each equals a run of the whole
    prompt knocking out its token, in any order of positions and across runs of rows with different starts."""
    positions = [9, 2, 14, 5, 11]
    seq = len(model.tokenizer(PROMPT).input_ids)
    shared = knockout(model, PROMPT, positions, metric=whole, batch_size=2)
    read: list = []
    with model.trace(PROMPT):
        read.append(model.logits.save())
    for position in positions:
        with model.trace(PROMPT):
            knock_out(model, [position])
            read.append(model.logits.save())
    clean, *knocked = read
    assert shared.shape == (len(positions), seq, model.vocab_size)
    for change, alone, position in zip(shared, knocked, positions, strict=True):
        torch.testing.assert_close(change, (alone - clean)[0].float(), rtol=1e-4, atol=1e-5, msg=f"position {position}")
        assert change[position + 1 :].abs().max() > 1e-6, f"knocking out {position} changed no later token"


def test_knockout_runs_each_mamba_scan_from_its_arguments(monkeypatch):
    """Every knocked run's Mamba-1 scans, the whole prompt's and the continued ones, are computed from their arguments
    (``run_from_arguments``), not by transformers' loop; what they give is checked against the loop above."""
    model = mild_decays(tiny_standardized("mamba"))
    computed = []
    outputs = nnterp_mamba.selective_scan.selective_scan_head_outputs

    def counted(*args, **kwargs):
        computed.append(args[-1] is not None)  # whether it continues from an entering state
        return outputs(*args, **kwargs)

    monkeypatch.setattr(nnterp_mamba.selective_scan, "selective_scan_head_outputs", counted)
    knockout(model, PROMPT, [0, 9, 14], batch_size=2)
    blocks = len(model.layers)
    assert computed == [False] * blocks + [True] * blocks, "a knocked run's scan ran transformers' loop"


def test_a_prompt_run_in_segments_and_continued_equals_the_whole_prompt(model):
    """A prompt run in calls continuing from the cache the last one left gives the whole run's logits, and the cache
    kept at a start, copied to several rows, continues the rest as the whole run does: a Mamba-1 scan, which starts
    from zeros, is told what it continues from."""
    ids = model.tokenizer(PROMPT, return_tensors="pt").input_ids
    split, every = 7, mixers(model)
    read: list = []
    with model.trace(ids):
        read.append(model.logits.save())
    whole_run = read[0]
    segments = run_in_segments(model, ids, [3, split], every)
    torch.testing.assert_close(segments.logits, whole_run, rtol=1e-4, atol=1e-5)
    prefix = segments.prefixes[split]
    cache = expanded(prefix.cache, 2)
    with model.trace(ids[:, split:].expand(2, -1), **continuation_inputs(model, cache, every, 2, ids.shape[1])):
        for block in every:
            continue_mixers(prefix, [block], 2)
        read.append(model.logits.save())
    continued = read[-1]
    torch.testing.assert_close(continued, whole_run[:, split:].expand(2, -1, -1), rtol=1e-4, atol=1e-5)
    # the kept cache is left as it was: a second continuation from it is the same run
    again = expanded(prefix.cache, 1)
    with model.trace(ids[:, split:], **continuation_inputs(model, again, every, 1, ids.shape[1])):
        for block in every:
            continue_mixers(prefix, [block], 1)
        read.append(model.logits.save())
    torch.testing.assert_close(read[-1], continued[:1], rtol=1e-5, atol=1e-6)


def test_a_continuation_runs_a_chunk_scan_in_chunks_that_fit_it():
    """A Mamba-2 built with 64-token chunks continues a 13-token suffix in 16-token chunks, not padded to 64, with
    the knockout a whole run gives; every chunk size is restored after."""
    model = mild_decays(tiny_standardized("mamba2", chunk_size=64))
    scans = [block.recurrent._module for block in mixers(model)]
    seen: list[int] = []
    hooks = [scan.register_forward_pre_hook(lambda scan, _: seen.append(scan.chunk_size)) for scan in scans]
    try:
        shared = knockout(model, PROMPT, [5], metric=whole)
    finally:
        for hook in hooks:
            hook.remove()
    read: list = []
    for knocked in (False, True):
        with model.trace(PROMPT):
            if knocked:
                knock_out(model, [5])
            read.append(model.logits.save())
    torch.testing.assert_close(shared[0], (read[1] - read[0])[0].float(), rtol=1e-4, atol=1e-5)
    assert 16 in seen, f"the 13-token continuation ran in chunks of {sorted(set(seen))}"
    assert [scan.chunk_size for scan in scans] == [64] * len(scans), "a chunk size was left fitted"


def test_knockout_runs_a_long_chunk_scan_in_its_pure_torch_chunks():
    """A Mamba-2 built with 256-token chunks knocks out of a 200-token prompt in chunks of at most TORCH_SCAN_CHUNK,
    each row equal to a whole run knocking out its token in the built chunks; every chunk size is restored after."""
    model = mild_decays(tiny_standardized("mamba2", chunk_size=256))
    scans = [block.recurrent._module for block in mixers(model)]
    ids = torch.randint(3, model.vocab_size, (1, 200), generator=torch.Generator().manual_seed(0))
    positions = [3, 130]
    seen: list[int] = []
    hooks = [scan.register_forward_pre_hook(lambda scan, _: seen.append(scan.chunk_size)) for scan in scans]
    try:
        shared = knockout(model, ids, positions, metric=whole, batch_size=1)
    finally:
        for hook in hooks:
            hook.remove()
    assert max(seen) <= TORCH_SCAN_CHUNK, f"the knockout ran in chunks of {sorted(set(seen))}"
    assert [scan.chunk_size for scan in scans] == [256] * len(scans), "a chunk size was left capped"
    read: list = []
    for knocked in ([], *([position] for position in positions)):
        with model.trace(ids):
            if knocked:
                knock_out(model, knocked)
            read.append(model.logits.save())
    clean, *alone = read
    for change, whole_run, position in zip(shared, alone, positions, strict=True):
        torch.testing.assert_close(change, (whole_run - clean)[0].float(), rtol=1e-4, atol=1e-5, msg=f"{position}")


def test_a_recurrent_knockout_is_the_recurrence_without_the_tokens_write(model):
    """In the last recurrent block alone, a Mamba's knocked head outputs are its clean ones less column j of its token
    mixing; a gated DeltaNet's are the delta rule run again from the served values with key j at zero."""
    layers = blocks_with(model, "linear_attn")
    if not layers:
        pytest.skip("no recurrent mixer")
    mixer, j = model.layers[layers[-1]].linear_attn, 3
    served: list = []  # bound outside: a name first bound inside a trace does not survive it
    read: list = []
    with model.trace(PROMPT):
        served.extend(
            getattr(mixer, name).save() for name in ("attention_queries", "attention_keys", "attention_values")
        )
        served.extend((mixer.decays.save(), mixer.betas.save(), mixer.token_mixing().save()))
        served.append(mixer.attention_head_outputs.save())
    with model.trace(PROMPT):
        knock_out(model, [j], layers=[layers[-1]])
        read.append(mixer.attention_head_outputs.save())
    queries, keys, values, decays, betas, matrix, clean = served
    if model.family.__name__.endswith("qwen3_next"):
        keys = keys.clone()
        keys[:, j] = 0
        expected = reference_delta_rule(queries, keys, values, decays, betas)[1]
    else:
        expected = clean - mixed(matrix[..., j : j + 1], values[:, j : j + 1])
    assert not torch.allclose(read[0], clean), "the knockout changed nothing"
    torch.testing.assert_close(read[0].float(), expected.float(), rtol=1e-4, atol=1e-5)


def test_knockout_carries_through_every_step_of_generate(model):
    """The decode steps continue from the knocked prompt: knocked every step, they differ from the clean steps."""
    steps, j = 3, 1
    runs: list[list] = [[], []]
    for knocked, saved in ((False, runs[0]), (True, runs[1])):
        with model.generate(PROMPT, max_new_tokens=steps, min_new_tokens=steps, do_sample=False) as tracer:
            for _ in tracer.iter[:steps]:
                if knocked:
                    knock_out(model, [j])
                saved.append(model.logits[:, -1].save())
    assert all(not torch.allclose(clean, knocked) for clean, knocked in zip(*runs, strict=True)), (
        "a decode step read the knocked token"
    )


def test_patching_a_prompts_own_state_or_a_shared_prefix_changes_nothing(model):
    """The state after t depends on the tokens up to t alone, and the split run continues as the whole one does."""
    for source in (PROMPT, SAME_START):
        changes = patch_state(model, source, PROMPT, [2, 5], metric=whole)
        assert changes.abs().max() <= 1e-4, f"patching from {source!r} changed the target by {changes.abs().max():.2e}"
    moved = patch_state(model, OTHER, PROMPT, [2, 5], metric=whole)
    for change, t in zip(moved, [2, 5], strict=True):
        assert change[:t].abs().max() <= 1e-5, "a patch after t changed a token before t"
        assert change[t:].abs().max() > 1e-6, "patching another prompt's state changed nothing"


def test_patching_only_attention_blocks_continues_the_mamba_blocks_left_alone():
    """Jamba's Mamba-1 mixers, not patched, still run the continuation: one token at a time, from the cache."""
    model = mild_decays(tiny_standardized("jamba"))
    attention = blocks_with(model, "self_attn")
    assert attention and blocks_with(model, "linear_attn")
    changes = patch_state(model, PROMPT, PROMPT, [5], layers=attention, metric=whole)
    # restarting the Mamba blocks from zeros moves this tiny model's logits by about 3e-5; float rounding by 1e-7
    assert changes.abs().max() <= 1e-6, (
        f"patching its own keys and values changed the target by {changes.abs().max():.2e}"
    )


def test_patching_carries_into_generation(model):
    """Patched after the prompt's last token, the greedy steps continue from the source's state; its own, from its own."""
    steps, t = 3, len(model.tokenizer(PROMPT).input_ids) - 1
    own = patch_state(model, PROMPT, PROMPT, [t], metric=whole, max_new_tokens=steps)
    assert own.shape[1] == steps and own.abs().max() <= 1e-4, "patching its own state changed the generation"
    moved = patch_state(model, OTHER + " and more", PROMPT, [t], metric=whole, max_new_tokens=steps)
    # the prompt's last token reads a recurrent state after itself, but an attention's keys up to it are its own
    first = 0 if blocks_with(model, "linear_attn") else 1
    assert (moved[:, first:].abs().amax(-1) > 1e-6).all(), "a generated step did not continue from the patched state"


def test_knockout_carries_into_generation(model):
    changes = knockout(model, PROMPT, [2], metric=whole, max_new_tokens=3)
    assert changes.shape == (1, 3, model.vocab_size)
    assert (changes.abs().amax(-1) > 1e-6).all(), "a generated step read the knocked token"


@pytest.mark.filterwarnings(r"ignore:route_kernels\(\.\.\., 'torch'\):UserWarning")
def test_patch_state_is_set_state_after_on_every_later_token():
    """Against the primitive: a routed gated DeltaNet continuing from the source's state set with set_state_after."""
    model = mild_decays(tiny_standardized("qwen3_next"))
    layers, t = blocks_with(model, "linear_attn"), 3
    changes = patch_state(model, OTHER, PROMPT, [t], layers=layers, metric=whole)
    clean: list = []
    with model.trace(PROMPT):
        clean.append(model.logits.float().save())
    patched = clean[0] + changes
    states: list = []
    with model.trace(OTHER):
        states.extend(model.layers[layer].linear_attn.trajectory(positions=t).save() for layer in layers)
    family = REGISTRY.family("qwen3_next")
    route_kernels(family, "torch")
    try:
        routed = mild_decays(tiny_standardized("qwen3_next"))
        expected: list = []
        with routed.trace(PROMPT):
            for layer, state in zip(layers, states, strict=True):
                routed.layers[layer].linear_attn.set_state_after(t, state)
            expected.append(routed.logits.float().save())
    finally:
        route_kernels(family, "default")
    assert changes[:, t:].abs().max() > 1e-3, "the patch changed no later token"
    torch.testing.assert_close(patched, expected[0], rtol=1e-4, atol=1e-4)


def test_patching_some_heads_leaves_the_others():
    model = mild_decays(tiny_standardized("qwen3_next"))
    layers = blocks_with(model, "linear_attn")
    every = patch_state(model, OTHER, PROMPT, [3], layers=layers)
    none = patch_state(model, OTHER, PROMPT, [3], layers=layers, heads=[])
    some = patch_state(model, OTHER, PROMPT, [3], layers=layers, heads=[0])
    assert none.abs().max() <= 1e-4 and some.abs().max() > 1e-4
    assert not torch.allclose(some, every)


def test_which_mixer_a_block_runs_first_is_read_from_its_forward(monkeypatch):
    """Zamba's hybrid block calls its shared transformer (holding self_attn) before its Mamba decoder, Falcon-H1's
    its Mamba before its attention; a block with one mixer has no order to read, and a forward that calls neither
    holder itself is named in the error."""
    zamba, falcon = tiny_standardized("zamba"), tiny_standardized("falcon_h1")
    hybrid = next(block for block in zamba.layers if getattr(block, "self_attn", None) is not None)
    assert hybrid.attention_first() is True
    assert falcon.layers[0].attention_first() is False
    assert zamba.layers[0].attention_first() is False
    monkeypatch.setattr(type(falcon.layers[0]._module), "forward", forward_through_a_helper)
    with pytest.raises(
        NotInForward, match=r"forward_through_a_helper \(transformers .*\) was expected to call self.mamba"
    ):
        falcon.layers[0].attention_first()


def forward_through_a_helper(self, hidden_states, **kwargs):
    return run_both_mixers(self, hidden_states)


def run_both_mixers(block, hidden_states):
    return block.self_attn(hidden_states) + block.mamba(hidden_states)
