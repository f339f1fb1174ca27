"""Models placed by accelerate serve every value a plain load serves, and take writes the same way.

Four placements of a saved tiny model: a block on disk, the embedding on disk
(the first entry of the device map), ``device_map="auto"`` within a memory
budget too small for the model (the rest goes to disk), and
``accelerate.cpu_offload``. For an attention family, a gated-DeltaNet hybrid,
a Mamba-1 and a Mamba-2 family: every value ``support()`` says a block has,
each read in its own trace, the logits after a write, the decode steps of
``generate``, and the per-token states a routed mixer serves.
"""

from __future__ import annotations

import pytest
import torch

import nnterp
from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT, block_value, close, save_tiny

FAMILIES = ("llama", "qwen3_next", "mamba", "mamba2")
PLACEMENTS = ("a block on disk", "the embedding on disk", "auto within max_memory", "cpu_offload")


def device_map(module: torch.nn.Module, on_disk: str) -> dict[str, str]:
    """Every child of the backbone, every block and the head on the CPU, except ``on_disk``, first in the map."""
    paths = {id(child): path for path, child in module.named_modules()}
    embedding = paths[id(module.get_input_embeddings())]
    backbone = embedding.rpartition(".")[0]
    entries = {}
    for name, child in module.get_submodule(backbone).named_children():
        if isinstance(child, torch.nn.ModuleList):
            entries.update({f"{backbone}.{name}.{i}": "cpu" for i in range(len(child))})
        else:
            entries[f"{backbone}.{name}"] = "cpu"
    entries["lm_head"] = "cpu"
    blocks = next(
        name
        for name, child in module.get_submodule(backbone).named_children()
        if isinstance(child, torch.nn.ModuleList)
    )
    chosen = [embedding] if on_disk == "embedding" else [f"{backbone}.{blocks}.0"]
    if on_disk == "embedding" and module.get_output_embeddings().weight is module.get_input_embeddings().weight:
        chosen.append("lm_head")  # a tied head goes where its embedding goes (see the test of the refusal)
    return {**dict.fromkeys(chosen, "disk"), **{path: device for path, device in entries.items() if path not in chosen}}


def load(directory: str, placement: str, tmp_path, plain: StandardizedTransformer) -> StandardizedTransformer:
    folder = str(tmp_path / "offload")
    if placement == "cpu_offload":
        from accelerate import cpu_offload
        from transformers import AutoModelForCausalLM

        module = AutoModelForCausalLM.from_pretrained(directory)
        cpu_offload(module, execution_device="cpu")
        return StandardizedTransformer(module, tokenizer=plain.tokenizer)
    if placement == "auto within max_memory":
        budget = sum(p.numel() * p.element_size() for p in plain._module.parameters()) // 3
        return StandardizedTransformer(directory, device_map="auto", max_memory={"cpu": budget}, offload_folder=folder)
    on_disk = "embedding" if placement == "the embedding on disk" else "block"
    return StandardizedTransformer(directory, device_map=device_map(plain._module, on_disk), offload_folder=folder)


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp(request.param))
    save_tiny(request.param, directory)
    return directory, StandardizedTransformer(directory)


def served(model: StandardizedTransformer) -> list[tuple[int, str]]:
    """Every (block, value) ``support()`` says the model serves, as a dotted name under the block."""
    return [
        (layer, name)
        for layer in range(model.num_layers)
        for name, reason in model.support(layer=layer).items()
        if reason is None
    ]


def read(model: StandardizedTransformer, layer: int, name: str) -> torch.Tensor:
    with model.trace(PROMPT):
        saved = getattr(*block_value(model, layer, name)).save()
    return saved


def same(actual, expected, what: str) -> None:
    if expected is None:
        assert actual is None, f"{what} is served where a plain load has none"
    elif isinstance(expected, torch.Tensor):
        assert actual.device == torch.device("cpu"), f"{what} came back on {actual.device}"
        close(actual, expected, what=what)
    else:
        assert type(actual) is type(expected), what
        for index, (one, other) in enumerate(zip(actual, expected, strict=True)):
            same(one, other, f"{what}[{index}]")


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_value_and_a_write_match_a_plain_load(saved, placement, tmp_path):
    directory, plain = saved
    model = load(directory, placement, tmp_path, plain)
    values = served(plain)
    assert values == served(model)
    for layer, name in values:
        same(read(model, layer, name), read(plain, layer, name), f"layers[{layer}].{name} under {placement}")
    assert model.device == torch.device("cpu"), "inputs do not go where the embedding runs"
    written = []
    for each in (plain, model):
        with each.trace(PROMPT):
            each.layers[0].layer_output[:, 1:] = each.layers[0].layer_output[:, 1:] * 0.5
            written.append(each.logits.save())
    same(written[1], written[0], "logits after a layer_output write")
    with plain.trace(PROMPT):
        unwritten = plain.logits.save()
    assert not torch.allclose(unwritten, written[0]), "the write changed nothing"


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_decode_steps_match_a_plain_load(saved, placement, tmp_path):
    directory, plain = saved
    model = load(directory, placement, tmp_path, plain)
    steps = []
    for each in (plain, model):
        mixer = next(
            (block.linear_attn for block in each.layers if getattr(block, "linear_attn", None) is not None), None
        )
        saved_steps = []
        with each.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
            for _ in tracer.iter[0:3]:
                saved_steps.append(each.layers[-1].layer_output.save())
                saved_steps.append(each.logits.save())
            tokens = tracer.result.save()
        steps.append((saved_steps, tokens))
        if mixer is not None:
            with each.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
                for _ in tracer.iter[0:3]:
                    saved_steps.append(mixer.state_output.save())
    (plain_steps, plain_tokens), (placed_steps, placed_tokens) = steps
    assert torch.equal(placed_tokens, plain_tokens)
    assert len(placed_steps) == len(plain_steps)
    same(placed_steps, plain_steps, f"decode-step values under {placement}")


@pytest.fixture
def routed(saved):
    directory, plain = saved
    if not any(getattr(block, "linear_attn", None) is not None for block in plain.layers):
        pytest.skip("no recurrent mixer to route")
    nnterp.route_kernels(plain.family, "torch")
    yield directory
    nnterp.route_kernels(plain.family, "default")


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_routed_per_token_states_match_a_plain_load(routed, placement, tmp_path):
    plain = StandardizedTransformer(routed)
    model = load(routed, placement, tmp_path, plain)
    blocks = [i for i, block in enumerate(plain.layers) if getattr(block, "linear_attn", None) is not None]
    if "chunk_per_token" in (plain.support(layer=blocks[0])["linear_attn.states"] or ""):
        for each in (plain, model):
            nnterp.chunk_per_token(each)  # Mamba-2: every token a chunk boundary, where the scan holds the state
    for layer in blocks:
        same(read(model, layer, "linear_attn.states"), read(plain, layer, "linear_attn.states"), f"states[{layer}]")


def test_a_device_map_splitting_tied_weights_across_disk_is_refused_before_loading(tmp_path):
    directory = save_tiny("mamba", str(tmp_path / "mamba"))
    plain = StandardizedTransformer(directory)
    assert plain._module.config.tie_word_embeddings
    split = {**device_map(plain._module, "embedding"), "lm_head": "cpu"}
    model = StandardizedTransformer(directory, device_map=split, offload_folder=str(tmp_path / "offload"))
    with pytest.raises(ValueError, match=r"'backbone.embeddings' on 'disk'.*'lm_head' on 'cpu'.*same entry"):
        with model.trace(PROMPT):
            model.logits.save()
    assert not model.dispatched and model.device == torch.device("meta")
