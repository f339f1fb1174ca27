"""The logit lens and steering (``nnterp.analysis.lens``) on tiny random-weight models.

``logit_lens`` of the last block is the model's logits on every family (``LayerSuite``); here, on
a tiny Llama: selections of layers and positions are slices of the whole lens, the lens works on
decode steps and on an offloaded head; each transform of ``HEAD_TRANSFORMS`` is needed where a
model applies it and left out where its forward ignores the config's number; ``steer`` adds its
vector exactly where asked, changes what follows and nothing before, steers generation, and
refuses a vector of the wrong size before the model runs.
"""

from __future__ import annotations

import pytest
import torch

from nnterp import StandardizedTransformer, Unavailable
from nnterp.analysis.lens import logit_lens, steer, unembed
from nnterp.census import family_of
from nnterp.testing import PROMPT, close, save_tiny, tiny_standardized


@pytest.fixture(scope="module")
def llama() -> StandardizedTransformer:
    return tiny_standardized("llama")


def test_logit_lens_selections_are_slices_of_the_whole_lens(llama) -> None:
    with llama.trace(PROMPT):
        whole = logit_lens(llama).save()
        logits = llama.logits.save()
    seq = logits.shape[1]
    assert tuple(whole.shape) == (llama.num_layers, 1, seq, llama.vocab_size) and whole.dtype == torch.float32
    close(whole[-1], logits.float(), what="the last block's lens vs the logits")
    assert not torch.allclose(whole[0], whole[-1]), "every block's lens is the same"
    asked = [
        (dict(layers=[1, 0], positions=[-1, 2, 2]), whole[[1, 0]][:, :, [-1, 2, 2]]),
        (dict(layers=-1, positions=-1), whole[-1][:, -1]),
        (dict(layers=slice(1, None), positions=slice(None, None, 2)), whole[1:][:, :, ::2]),
        (dict(positions=[0]), whole[:, :, [0]]),
        (dict(layers=0), whole[0]),
    ]
    for selection, expected in asked:
        with llama.trace(PROMPT):
            lens = logit_lens(llama, **selection).save()
        close(lens, expected, atol=1e-6, what=f"logit_lens({selection})")


def test_unembed_outside_a_trace_is_the_lens(llama) -> None:
    with llama.trace(PROMPT):
        hidden = llama.layers[0].layer_output.save()
    with llama.trace(PROMPT):
        lens = logit_lens(llama, layers=0).save()
    with torch.no_grad():
        outside = unembed(llama, hidden)
    close(outside.float(), lens, what="unembed of layers[0].layer_output outside a trace vs its lens")


def test_logit_lens_refuses_layers_outside_the_model(llama) -> None:
    with pytest.raises(IndexError, match="layers=5 reaches outside the model's 2 blocks"):
        with llama.trace(PROMPT):
            logit_lens(llama, layers=5).save()


def test_logit_lens_on_decode_steps_is_each_steps_logits(llama) -> None:
    lenses, logits = [], []
    with llama.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
        for _ in tracer.iter[:3]:
            lenses.append(logit_lens(llama, layers=[-1], positions=[-1]).save())
            logits.append(llama.logits.save())
    assert len(lenses) == 3
    for step, (lens, step_logits) in enumerate(zip(lenses, logits, strict=True)):
        close(lens[0], step_logits[:, -1:].float(), what=f"step {step}: the last block's lens vs the logits")


def test_unembed_runs_an_offloaded_head(llama, tmp_path) -> None:
    """The final norm and the head on disk: unembed's ad hoc calls go through accelerate's hooks."""
    path = save_tiny("llama", tmp_path / "tiny-llama")
    on_disk = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu", "model.rotary_emb": "cpu"}
    on_disk |= {"model.norm": "disk", "lm_head": "disk"}
    offloaded = StandardizedTransformer(
        path, device_map=on_disk, offload_folder=str(tmp_path / "offload"), attn_implementation="eager"
    )
    with offloaded.trace(PROMPT):
        lens = logit_lens(offloaded, positions=[-1]).save()
        logits = offloaded.logits.save()
    with llama.trace(PROMPT):
        plain = logit_lens(llama, positions=[-1]).save()
    close(lens[-1], logits[:, -1:].float(), what="the offloaded model's last block's lens vs its logits")
    close(lens, plain, what="the offloaded model's lens vs the plain model's")


def last_block_lens_and_logits(model: StandardizedTransformer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The last block's lens, the logits, and the last block's output through the final norm and head alone."""
    with model.trace(PROMPT):
        hidden = model.layers[-1].layer_output.save()
        lens = logit_lens(model, layers=-1).save()
        logits = model.logits.save()
    with torch.no_grad():
        bare = model.lm_head._module(model.ln_final._module(hidden)).float()
    return lens, logits.float(), bare


def test_gemma2_lens_soft_caps_the_logits() -> None:
    model = tiny_standardized("gemma2", final_logit_softcapping=0.1)
    lens, logits, bare = last_block_lens_and_logits(model)
    close(lens, logits, what="gemma-2's last block's lens vs its soft-capped logits")
    assert logits.abs().max() < 0.1 < bare.abs().max(), "the soft cap does not bite on this model"


#: Each transform of HEAD_TRANSFORMS on a model type that applies it, with a number that changes the logits.
TRANSFORMED = [
    ("gemma3_text", dict(final_logit_softcapping=0.1)),
    ("vaultgemma", dict(final_logit_softcapping=0.1)),
    ("cohere", dict(logit_scale=3.0)),
    ("granite", dict(logits_scaling=4.0)),
    ("granitemoehybrid", dict(logits_scaling=4.0)),
    ("hyperclovax", dict(logits_scaling=4.0)),
    ("minicpm3", dict(dim_model_base=8)),  # logits_scaling is hidden_size / dim_model_base
    ("falcon_h1", dict(lm_head_multiplier=3.0)),
]


@pytest.mark.parametrize(("model_type", "numbers"), TRANSFORMED, ids=[row[0] for row in TRANSFORMED])
def test_the_lens_applies_what_the_forward_applies_to_the_head(model_type, numbers) -> None:
    model = tiny_standardized(family_of(model_type), **numbers)
    lens, logits, bare = last_block_lens_and_logits(model)
    close(lens, logits, what=f"{model_type}'s last block's lens vs its logits, with {numbers}")
    assert not torch.allclose(bare, logits, atol=1e-3), f"{numbers} leaves {model_type}'s logits as the head gives them"


def test_a_number_the_forward_ignores_is_ignored() -> None:
    """MPT's config carries a logit_scale its forward never reads."""
    model = tiny_standardized("mpt", logit_scale=3.0)
    lens, logits, _ = last_block_lens_and_logits(model)
    close(lens, logits, what="mpt's last block's lens vs its logits, with logit_scale=3.0 in its config")


@pytest.mark.filterwarnings("ignore:Module .* has a submodule named 'output'")
def test_a_head_the_table_cannot_express_is_unavailable_before_the_model_runs() -> None:
    model = tiny_standardized(family_of("prophetnet"))
    calls = []
    hook = model._module.get_input_embeddings().register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(Unavailable, match="unembed on a prophetnet model: its blocks carry the main stream"):
            with model.trace(PROMPT):
                logit_lens(model).save()
        with pytest.raises(Unavailable, match="prophetnet"):
            unembed(model, torch.zeros(1, 3, model.hidden_size))
    finally:
        hook.remove()
    assert not calls, "the model ran before the lens was refused"


def test_steer_adds_the_vector_at_the_asked_positions_and_changes_only_what_follows(llama) -> None:
    vector = torch.randn(llama.hidden_size, generator=torch.Generator().manual_seed(0))
    with llama.trace(PROMPT):
        clean_stream = llama.layers[0].layer_output.save()
        clean = llama.logits.save()
    for positions in ([3], 3, [3, 5], slice(3, None)):
        with llama.trace(PROMPT):
            steer(llama.layers[0], "layer_output", vector, positions=positions)
            received = llama.layers[1].layer_input.save()
            steered = llama.logits.save()
        expected = clean_stream.clone()
        expected[:, positions] += vector
        close(received, expected, atol=1e-6, what=f"layers[1].layer_input after steering positions={positions}")
        close(steered[:, :3], clean[:, :3], atol=1e-6, what=f"logits before the steered positions={positions}")
        moved = (steered[0, 3:] - clean[0, 3:]).abs().amax(-1)
        assert (moved > 1e-4).all(), f"positions={positions}: logits at and after position 3 moved by {moved}"


def test_steering_every_position_by_default(llama) -> None:
    vector = torch.ones(llama.hidden_size)
    with llama.trace(PROMPT):
        clean = llama.layers[1].layer_output.save()
    with llama.trace(PROMPT):
        steer(llama.layers[1], "layer_output", vector)
        steered = llama.layers[1].layer_output.save()
    close(steered, clean + 1, atol=1e-6, what="layer_output steered at every position")


def test_a_steered_generate_step_changes_the_generated_tokens(llama) -> None:
    """Away from its own token's unembedding, greedy decoding cannot pick that token again, at that step only."""
    settings = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False)
    with llama.generate(PROMPT, **settings) as tracer:
        clean = tracer.result.save()
    prompt_length = len(llama.tokenizer(PROMPT).input_ids)
    chosen = clean[0, prompt_length + 1].item()
    away = -100 * llama._module.lm_head.weight[chosen].detach()
    with llama.generate(PROMPT, **settings) as tracer:
        for _ in tracer.iter[1]:
            steer(llama.layers[-1], "layer_output", away, positions=[-1])
        steered = tracer.result.save()
    assert torch.equal(steered[0, : prompt_length + 1], clean[0, : prompt_length + 1]), "an earlier token changed"
    assert steered[0, prompt_length + 1].item() != chosen, "the steered step generated the same token"


def test_a_wrong_sized_vector_raises_before_the_model_runs(llama) -> None:
    calls = []
    hook = llama._module.model.embed_tokens.register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(
            ValueError, match=r"steer layer_output on model\.model\.layers\.1: .* hidden_size axis of size 32"
        ):
            with llama.trace(PROMPT):
                steer(llama.layers[1], "layer_output", torch.ones(5), positions=[-1])
    finally:
        hook.remove()
    assert not calls, "the model ran before the wrong-sized vector was refused"
    with pytest.raises(ValueError, match="positions index the sequence axis"):
        with llama.trace(PROMPT):
            steer(llama.layers[0].self_attn, "attention_probabilities", torch.ones(4), positions=[-1])
