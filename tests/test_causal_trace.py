"""Causal tracing on an attention model, a gated DeltaNet hybrid, a Mamba-1 and a Mamba-2: what restoring a value must
and must not bring back, and a restored state checked against ``set_state_after`` in a run of its own."""

from __future__ import annotations

import pytest
import torch

import nnterp
from nnterp import Unavailable, route_kernels
from nnterp.analysis import causal_trace
from nnterp.testing import PROMPT, blocks_with, mild_decays, tiny_standardized

FAMILIES = ("llama", "qwen3_next", "mamba", "mamba2")
SUBJECT = [3, 4, 5]
VALUES = ("layer_output", "attention_output", "mlp_output")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return mild_decays(tiny_standardized(request.param))


def test_the_last_stream_restores_the_clean_answer_and_positions_before_the_subject_nothing(model):
    with_mlp = len(blocks_with(model, "mlp")) == model.num_layers  # Mamba's blocks have none
    trace = causal_trace(model, PROMPT, SUBJECT, values=VALUES if with_mlp else VALUES[:2])
    assert abs(trace.corrupted - trace.clean) > 1e-6, "the noise did not change the answer"
    stream = trace.values.index("layer_output")
    assert trace.scores[stream, -1, -1].item() == pytest.approx(trace.clean, abs=1e-5)
    untouched = trace.scores[:, :, : SUBJECT[0]]
    assert (untouched - trace.corrupted).abs().max() <= 1e-6, "restoring a token the noise never reached changed it"
    for index, value in enumerate(trace.values):
        brought = trace.indirect_effect[index, :, SUBJECT[0] :].abs().max()
        assert brought > 1e-6, f"restoring {value} brought nothing back: the write did not reach the model"


def test_each_score_is_its_restored_run_over_the_whole_prompt(model):
    """The rows continue from the cache of the tokens before the subject; each score equals a run of the whole prompt,
    corrupted, with that one value put back."""
    values = ("layer_output", "attention_output")
    trace = causal_trace(model, PROMPT, SUBJECT, values=values)
    ids = model.tokenizer(PROMPT, return_tensors="pt").input_ids
    for value in values:
        for layer in (0, model.num_layers - 1):
            owner = model.layers[layer] if value == "layer_output" else trace_mixer(model, layer)
            with torch.no_grad(), model.trace(ids):
                clean = getattr(owner, value).save()
            for position in (SUBJECT[0], SUBJECT[-1] + 1, ids.shape[1] - 1):
                read = []
                with torch.no_grad(), model.trace(ids):
                    model.embed_tokens.output[:, SUBJECT] += trace.noise
                    current = getattr(owner, value).clone()
                    current[:, position] = clean[:, position]
                    setattr(owner, value, current)
                    read.append(model.logits[:, -1].float().softmax(-1)[0, trace.answer].save())
                score = trace.scores[values.index(value), trace.layers.index(layer), position].item()
                # tight: a tiny Mamba-1's cached state moves these probabilities by about 2e-7 once lost
                assert score == pytest.approx(read[0].item(), abs=1e-7), (value, layer, position)


def trace_mixer(model, layer):
    block = model.layers[layer]
    return getattr(block, "linear_attn", None) or block.self_attn


def test_without_noise_every_row_is_the_clean_run(model):
    trace = causal_trace(model, PROMPT, SUBJECT, noise=0.0)
    assert trace.corrupted == pytest.approx(trace.clean, abs=1e-6)
    assert (trace.scores - trace.clean).abs().max() <= 1e-5


def test_a_batch_of_rows_is_each_row_run_alone():
    model = mild_decays(tiny_standardized("qwen3_next"))
    batched = causal_trace(model, PROMPT, SUBJECT, values=("layer_output", "mlp_output"), batch_size=16)
    alone = causal_trace(model, PROMPT, SUBJECT, values=("layer_output", "mlp_output"), batch_size=1)
    assert (batched.scores - alone.scores).abs().max() <= 1e-5


@pytest.mark.filterwarnings(r"ignore:route_kernels\(\.\.\., 'torch'\):UserWarning")
@pytest.mark.parametrize("family", ["qwen3_5_text", "mamba"])
def test_a_restored_state_is_set_state_after_in_a_run_of_its_own(family):
    family_module = getattr(nnterp.families, family)
    route_kernels(family_module, "torch")
    try:
        model = mild_decays(tiny_standardized(family))
        trace = causal_trace(model, PROMPT, SUBJECT, values=("state",))
        ids = model.tokenizer(PROMPT, return_tensors="pt").input_ids
        for layer in blocks_with(model, "linear_attn")[:1]:
            mixer = model.layers[layer].linear_attn
            with torch.no_grad(), model.trace(ids):
                clean = mixer.trajectory().save()
            for position in (SUBJECT[-1], SUBJECT[-1] + 2):
                read = []
                with torch.no_grad(), model.trace(ids):
                    model.embed_tokens.output[:, SUBJECT] += trace.noise
                    mixer.set_state_after(position, clean[:, position])
                    read.append(model.logits[:, -1].float().softmax(-1)[0, trace.answer].save())
                index = trace.layers.index(layer)
                assert trace.scores[0, index, position].item() == pytest.approx(read[0].item(), abs=1e-5)
        assert (trace.scores[0, :, : SUBJECT[0]] - trace.corrupted).abs().max() <= 1e-6
    finally:
        route_kernels(family_module, "default")


def test_bad_input_is_refused_before_anything_runs():
    model = tiny_standardized("qwen3_next")
    calls: list = []
    hook = model._module.get_input_embeddings().register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ValueError, match="causal_trace restores layer_output, .*not \\['residual'\\]"):
            causal_trace(model, PROMPT, SUBJECT, values=["residual"])
        with pytest.raises(ValueError, match="the subject 'Paris' is not in the prompt"):
            causal_trace(model, PROMPT, "Paris")
        with pytest.raises(IndexError, match=r"subject \[40\] are outside the"):
            causal_trace(model, PROMPT, [40])
        with pytest.raises(Unavailable, match=r"restoring the state of layers\[0\].linear_attn: .*route_kernels"):
            causal_trace(model, PROMPT, SUBJECT, values=["state"])
    finally:
        hook.remove()
    assert not calls, "the model ran before the bad input was refused"


def test_a_trace_plots_a_position_per_row_and_a_block_per_column(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    model = tiny_standardized("llama")
    trace = causal_trace(model, PROMPT, SUBJECT, values=("mlp_output", "layer_output"))
    tokens = model.tokenizer.convert_ids_to_tokens(model.tokenizer(PROMPT).input_ids)
    ax = trace.plot("layer_output", tokens)
    assert (ax.images[0].get_array() == trace.scores[1].T.numpy()).all()
    assert [label.get_text() for label in ax.get_yticklabels()][SUBJECT[0]] == f"{tokens[SUBJECT[0]]}*"
    ax.figure.savefig(tmp_path / "trace.png")


def test_a_subject_given_as_text_is_its_tokens():
    model = tiny_standardized("llama")
    by_text = causal_trace(model, PROMPT, "world", noise=1.0)
    assert by_text.subject == (6, 7, 8, 9, 10)  # the local tokenizer's tokens are characters, after BOS
    by_positions = causal_trace(model, PROMPT, [6, 7, 8, 9, 10], noise=1.0)
    assert torch.equal(by_text.scores, by_positions.scores)
