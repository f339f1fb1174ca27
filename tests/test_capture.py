"""nnterp.capture: the rows on disk are the model's values at the tokens they name, and a killed run resumes exactly.

Each captured row is checked against a trace of its own over the tokens the
shard says it holds; the token table against the tokenizer; reductions against
the full rows; a resumed run's files against an uninterrupted run's by hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from nnterp import StandardizedTransformer
from nnterp.capture import Activations, CaptureError, Value, capture
from nnterp.capture.shards import MANIFEST
from nnterp.cli import main
from nnterp.testing import blocks_with, close, save_tiny

TEXTS = [
    "Hello world, there is a cat on the mat.",
    "Another text, about dogs and cats and birds.",
    "short",
    "The quick brown fox jumps over the lazy dog.",
] * 3


@pytest.fixture(scope="module")
def deltanet(tmp_path_factory) -> StandardizedTransformer:
    directory = save_tiny("qwen3_next", tmp_path_factory.mktemp("qwen3_next") / "model")
    return StandardizedTransformer(directory)


def traced(model: StandardizedTransformer, ids: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """Each value of ``names`` (listed in forward order) from a plain trace over ``ids``."""
    saved = {}
    with model.trace({"input_ids": ids, "attention_mask": torch.ones_like(ids)}):
        for name in names:
            owner, _, attribute = name.rpartition(".")
            saved[name] = getattr(eval(f"model.{owner}") if owner else model, attribute).save()
    return saved


def sequences_of(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A shard's token table as ``[sequences, tokens]`` ids, and the sequences' global indices (packed: equal lengths)."""
    numbers = tensors["tokens#sequence"].unique()
    return tensors["tokens"].view(len(numbers), -1), numbers


def test_packed_rows_are_the_values_of_the_packed_token_stream(llama, tmp_path):
    names = [f"layers[{i}].layer_output" for i in reversed(range(llama.num_layers))] + ["logits"]
    acts = capture(llama, TEXTS, names, tmp_path, context=12, batch_size=3, shard_mib=0.004, progress=False)
    assert acts.complete and len(acts.shards) > 2, acts.shards
    assert acts.values["layers[0].layer_output"]["axes"] == ["token", "hidden_size"]
    tokenizer = llama.tokenizer
    stream = []
    for index, text in enumerate(TEXTS):
        stream += ([tokenizer.bos_token_id] if index else []) + tokenizer(text, add_special_tokens=False)["input_ids"]
    written = []
    for index in range(len(acts.shards)):
        tensors = acts.shard(index, verify=True)
        ids, numbers = sequences_of(tensors)
        assert (ids[:, 0] == tokenizer.bos_token_id).all(), "a packed sequence starts with BOS"
        written += ids[:, 1:].reshape(-1).tolist()
        expected = traced(llama, ids, names[-2::-1] + names[-1:])
        for name in names:
            rows = tensors[f"{name}#row"]
            places = numbers.tolist()
            batch_rows = torch.tensor([places.index(sequence) for sequence in rows[:, 0].tolist()])
            close(tensors[name], expected[name][batch_rows, rows[:, 1]], what=f"{name}, shard {index}")
    assert written == stream[: len(written)] and len(stream) - len(written) < 11, "the packed stream"
    assert len(acts) == len(stream) // 11


def test_unpacked_sequences_hold_no_padding_and_equal_each_text_alone(llama, tmp_path):
    values = ["layers[1].layer_output", Value("layers[1].layer_output", positions=-1)]
    acts = capture(llama, TEXTS[:4], values, tmp_path, context=20, batch_size=4, pack=False, progress=False)
    tensors = acts.shard(0)
    lengths = [min(len(llama.tokenizer(text)["input_ids"]), 20) for text in TEXTS[:4]]
    assert len(set(lengths)) > 1, "the batch must need padding"
    assert len(tensors["tokens"]) == sum(lengths) == len(tensors["layers[1].layer_output"])
    for sequence, text in enumerate(TEXTS[:4]):
        ids = torch.tensor([llama.tokenizer(text)["input_ids"][:20]])
        alone = traced(llama, ids, ["layers[1].layer_output"])["layers[1].layer_output"][0]
        mine = tensors["layers[1].layer_output#row"][:, 0] == sequence
        close(tensors["layers[1].layer_output"][mine], alone, what=f"text {sequence} in a padded batch")
        last = tensors["layers[1].layer_output(positions=-1)#row"][:, 0] == sequence
        close(tensors["layers[1].layer_output(positions=-1)"][last], alone[-1:], what=f"last token of text {sequence}")


def test_reductions_and_head_selections_are_computed_from_the_full_rows(llama, tmp_path):
    full = "layers[0].self_attn.attention_head_outputs"
    values = [
        full,
        "logits",
        Value(full, heads=[1, 0]),
        Value(full, heads=1, positions=slice(2, 5)),
        Value("logits", reduce="topk", k=3),
        Value("layers[0].layer_output", reduce="norm", dtype=torch.float64),
        Value("layers[0].layer_output", reduce="mean", positions=[0, 2]),
        "layers[0].layer_output",
    ]
    acts = capture(llama, TEXTS, values, tmp_path, context=10, batch_size=2, progress=False)
    tensors = acts.shard(0)
    heads = tensors[full]
    close(tensors[f"{full}(heads=[1, 0])"], heads[:, [1, 0]], what="heads=[1, 0]")
    picked = (tensors[f"{full}#row"][:, 1] >= 2) & (tensors[f"{full}#row"][:, 1] < 5)
    close(tensors[f"{full}(positions=2:5, heads=1)"], heads[picked, 1], what="positions=2:5, heads=1")
    top = tensors["logits"].topk(3, dim=-1)
    close(tensors["logits(reduce=topk, k=3)"], top.values, what="top-k values")
    assert torch.equal(tensors["logits(reduce=topk, k=3)#indices"], top.indices)
    norm = tensors["layers[0].layer_output(reduce=norm, dtype=float64)"]
    assert norm.dtype == torch.float64
    close(norm, tensors["layers[0].layer_output"].norm(dim=-1).double(), what="norm")
    rows = tensors["layers[0].layer_output#row"]
    means = tensors["layers[0].layer_output(positions=[0, 2], reduce=mean)"]
    for index, sequence in enumerate(tensors["layers[0].layer_output(positions=[0, 2], reduce=mean)#row"].tolist()):
        mine = (rows[:, 0] == sequence) & ((rows[:, 1] == 0) | (rows[:, 1] == 2))
        close(means[index], tensors["layers[0].layer_output"][mine].mean(0), what=f"mean of sequence {sequence}")
    assert acts.values[f"{full}(positions=2:5, heads=1)"]["axes"] == ["token", "head_dim"]


def test_recurrent_states_token_mixing_and_routing_rows_are_the_models_own(deltanet, tmp_path):
    layer = blocks_with(deltanet, "linear_attn")[0]
    mixer = f"layers[{layer}].linear_attn"
    routing = f"layers[{layer}].mlp.expert_indices"
    values = [
        Value(f"{mixer}.trajectory", positions=[0, 5, -1]),
        f"{mixer}.state_output",
        Value(f"{mixer}.token_mixing", positions=-1, heads=0),
        routing,
    ]
    acts = capture(deltanet, TEXTS, values, tmp_path, context=12, batch_size=2, progress=False)
    tensors = acts.shard(0)
    trajectory = tensors[f"{mixer}.trajectory(positions=[0, 5, -1])"]
    rows = tensors[f"{mixer}.trajectory(positions=[0, 5, -1])#row"]
    assert sorted(set(rows[:, 1].tolist())) == [0, 5, 11]
    close(trajectory[rows[:, 1] == 11], tensors[f"{mixer}.state_output"], what="states[:, -1] == state_output")
    ids, _ = sequences_of(tensors)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    block = deltanet.layers[layer].linear_attn
    with deltanet.trace(inputs):
        states = block.trajectory(positions=[0, 5, 11]).save()
        mixing = block.token_mixing(positions=-1, heads=0).save()
        experts = deltanet.layers[layer].mlp.expert_indices.save()
    assert tensors[routing].dtype == experts.dtype and not experts.is_floating_point()
    assert torch.equal(tensors[routing], experts.flatten(0, 1)), "each token's routed experts"
    close(trajectory, states.flatten(0, 1), what="trajectory rows")
    close(tensors[f"{mixer}.token_mixing(positions=-1, heads=0)"], mixing, what="token_mixing rows")
    assert acts.values[f"{mixer}.token_mixing(positions=-1, heads=0)"]["axes"] == ["token", "key"]


def test_batches_draw_every_row_once_across_shards_the_same_for_a_seed(llama, tmp_path):
    acts = capture(
        llama, TEXTS, ["layers[0].layer_output"], tmp_path, context=8, batch_size=2, shard_mib=0.002, progress=False
    )
    assert len(acts.shards) >= 4
    every = torch.cat([rows for rows, _ in acts.rows("layers[0].layer_output")])
    drawn = list(acts.batches("layers[0].layer_output", 16, seed=3))
    assert all(len(batch) == 16 for batch in drawn[:-1])
    assert torch.equal(torch.cat(drawn).sort(0).values, every.sort(0).values), "every row once"
    again = list(acts.batches("layers[0].layer_output", 16, seed=3))
    assert all(torch.equal(a, b) for a, b in zip(drawn, again, strict=True)), "the same seed, the same batches"
    other = list(acts.batches("layers[0].layer_output", 16, seed=4))
    assert not torch.equal(torch.cat(drawn), torch.cat(other))
    shard_of = {
        row.numpy().tobytes(): i for i, (rows, _) in enumerate(acts.rows("layers[0].layer_output")) for row in rows
    }
    assert len({shard_of[row.numpy().tobytes()] for row in drawn[0]}) > 1, "a batch mixes shards"


#: A capture run in a process of its own: the arguments come from the command line.
CAPTURE = textwrap.dedent(
    """
    import sys
    from nnterp.capture import capture
    capture(sys.argv[1], [f"text number {i}: " + "abcdefghij" * (i % 5 + 1) for i in range(400)],
            ["layers[0].layer_output", "layers[1].mlp.mlp_output"], sys.argv[2], context=16, batch_size=4,
            shard_mib=0.01, progress=False)
    """
)


def hashes(directory: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


def test_a_killed_capture_resumes_to_the_same_bytes(llama, tmp_path):
    model = save_tiny("llama", tmp_path / "model")
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    subprocess.run([sys.executable, "-c", CAPTURE, model, whole], check=True, timeout=600)
    run = subprocess.Popen([sys.executable, "-c", CAPTURE, model, resumed])
    deadline = time.monotonic() + 300
    while run.poll() is None and time.monotonic() < deadline:
        manifest = resumed / MANIFEST
        if manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 3:
            break
        time.sleep(0.02)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    killed = json.loads((resumed / MANIFEST).read_text())
    assert not killed["complete"] and len(killed["shards"]) < len(json.loads((whole / MANIFEST).read_text())["shards"])
    partial = Activations(resumed)
    for index in range(len(partial.shards)):
        partial.shard(index, verify=True)
    subprocess.run([sys.executable, "-c", CAPTURE, model, resumed], check=True, timeout=600)
    assert hashes(resumed) == hashes(whole)


#: A capture in a process that may not write a file past a size (RLIMIT_FSIZE), as on a disk that fills up:
#: the texts grow longer, and with them the shards, until one no longer fits.
FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys
    from nnterp.capture import CaptureError, capture
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
    try:
        capture(sys.argv[1], [f"text number {i}: " + "abcdefghij" * (i // 40 + 1) for i in range(400)],
                ["layers[0].layer_output"], sys.argv[2], context=64, batch_size=4, pack=False, shard_mib=0.01,
                progress=False)
    except CaptureError as error:
        print(error)
        sys.exit(3)
    """
)


def test_a_full_disk_stops_at_the_shard_it_meets_and_leaves_the_rest_valid(tmp_path):
    model = save_tiny("llama", tmp_path / "model")
    out = tmp_path / "out"
    probe = subprocess.run(
        [sys.executable, "-c", FULL_DISK, model, out, str(24 * 1024)], capture_output=True, text=True, timeout=600
    )
    assert probe.returncode == 3, probe.stderr[-2000:]
    assert "could not write shard" in probe.stdout and "run the same capture again" in probe.stdout, probe.stdout
    manifest = json.loads((out / MANIFEST).read_text())
    assert not manifest["complete"] and manifest["shards"]
    assert not list(out.glob("*.partial")), "a half-written shard was left behind"
    assert {path.name for path in out.glob("shard-*")} == {shard["file"] for shard in manifest["shards"]}
    acts = Activations(out)
    for index in range(len(acts.shards)):
        acts.shard(index, verify=True)
    subprocess.run([sys.executable, "-c", FULL_DISK, model, out, str(2**30)], check=True, timeout=600)
    assert Activations(out).complete


@pytest.mark.parametrize(
    "model, value, message",
    [
        ("llama", "layers[0].layer_outptu", "serves no value 'layer_outptu'.*did you mean 'layer_output'"),
        ("llama", "layers[9].layer_output", r"layers has 2 entries, so \[9\] is out of range"),
        ("llama", "layers[0].linear_attn.states", "has no module 'linear_attn'"),
        ("deltanet", "layers[0].linear_attn.states", r"not served on this model: .*nnterp.route_kernels\(model.family"),
        (
            "llama",
            "layers[0].self_attn.attention_head_outputs(heads=[7])",
            r"heads=\[7\] reaches outside its 4 num_heads",
        ),
        (
            "llama",
            "layers[0].layer_output(positions=[40])",
            r"positions=\[40\] reaches outside a sequence of context=16",
        ),
        ("llama", "logits(reduce=topk, k=1000)", "k=1000 is more than its last axis's 64 vocab_size"),
        ("llama", "logits(k=3)", "k= goes with reduce='topk'"),
        ("llama", "layers[0].layer_output(reduce=max)", "a capture reduces by mean, norm, topk"),
        ("llama", "layers[0].layer_output(position=1)", "'position=1' is not an option"),
        ("llama", "layers.0.layer_output", "is not a standard name"),
    ],
)
def test_a_bad_value_fails_before_anything_runs(request, tmp_path, model, value, message):
    with pytest.raises(CaptureError, match=message):
        capture(request.getfixturevalue(model), TEXTS, [value], tmp_path / "out", context=16, progress=False)
    assert not (tmp_path / "out").exists()


def test_bad_sources_directories_and_contexts_fail_before_anything_runs(llama, tmp_path):
    datasets = pytest.importorskip("datasets")
    untitled = datasets.Dataset.from_dict({"body": TEXTS})
    with pytest.raises(CaptureError, match="no column 'text'; its columns are body: pass text_column="):
        capture(llama, untitled, ["layers[0].layer_output"], tmp_path / "a", progress=False)
    record = tmp_path / "records.jsonl"
    record.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(CaptureError, match="records.jsonl:1 has no field 'text'"):
        capture(llama, [record], ["layers[0].layer_output"], tmp_path / "b", progress=False)
    assert not list((tmp_path / "b").glob("shard-*"))
    with pytest.raises(CaptureError, match="no text file at"):
        capture(llama, [tmp_path / "missing.txt"], ["layers[0].layer_output"], tmp_path / "c", progress=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CaptureError, match="cannot write the capture to .*choose a directory you can write"):
        capture(llama, TEXTS, ["layers[0].layer_output"], blocker / "out", progress=False)
    longest = llama.text_config.max_position_embeddings
    with pytest.raises(CaptureError, match=f"context={longest + 1} is longer than this model's {longest} positions"):
        capture(llama, TEXTS, ["layers[0].layer_output"], tmp_path / "d", context=longest + 1, progress=False)
    capture(llama, TEXTS, ["layers[0].layer_output"], tmp_path / "e", context=8, progress=False)
    before = hashes(tmp_path / "e")
    with pytest.raises(CaptureError, match=r"other settings \(context differ\)"):
        capture(llama, TEXTS, ["layers[0].layer_output"], tmp_path / "e", context=9, progress=False)
    assert hashes(tmp_path / "e") == before
    named = datasets.Dataset.from_dict({"body": TEXTS})
    acts = capture(
        llama, named, ["layers[0].layer_output"], tmp_path / "f", text_column="body", context=8, progress=False
    )
    assert acts.shard(0)["tokens"].tolist() == Activations(tmp_path / "e").shard(0)["tokens"].tolist()


def test_the_command_line_writes_what_the_function_writes(llama, tmp_path, capsys):
    model = save_tiny("llama", tmp_path / "model")
    files = []
    for index, text in enumerate(TEXTS):
        files.append(tmp_path / f"{index}.txt")
        files[-1].write_text(text)
    value = "layers[1].layer_output(positions=-1, dtype=float16)"
    arguments = ["capture", model, str(tmp_path / "cli"), "--value", value, "--texts", *map(str, files)]
    assert main([*arguments, "--context", "10", "--batch-size", "3"]) == 0
    assert "shards in" in capsys.readouterr().out
    acts = capture(model, TEXTS, [value], tmp_path / "api", context=10, batch_size=3, progress=False)
    written = Activations(tmp_path / "cli")
    assert written.values == acts.values and written.values[value]["dtype"] == "float16"
    assert torch.equal(written.shard(0)[value], acts.shard(0)[value])
    assert main(["capture", model, str(tmp_path / "bad"), "--value", "layers[0].nope", "--texts", str(files[0])]) == 2
    assert "serves no value 'nope'" in capsys.readouterr().err
