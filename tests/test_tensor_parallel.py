"""A model split by transformers' tensor parallelism serves every value whole, and takes every write whole.

``torchrun --nproc-per-node 2`` on the CPU (gloo) runs ``tensor_parallel_rank.py``
on a tiny Llama, Qwen3-Next and Mixtral, each with two key/value heads; what rank
0 read is compared with one process reading the same checkpoint. Between them
the values cover the three ways a rank holds a value: whole (the residual
stream; Qwen3-Next's gated DeltaNet, whose projections gather their output), a
slice of one axis (the attention's heads, the MLP's neurons), and a term of a
sum (each expert slot's output inside the experts, which the ranks
all-reduce). A write, by assignment or in place under ``torch.no_grad()``,
gives the logits one process gives, and a split module called on a whole
tensor returns it whole.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
import transformers
from packaging.version import Version

from nnterp import StandardizedTransformer, route_kernels
from nnterp.testing import PROMPT, block_value, close, save_tiny

RANK = pathlib.Path(__file__).with_name("tensor_parallel_rank.py")

#: family -> (tiny config overrides, route its kernels to torch, the values each run writes, in the forward's order,
#: the values it takes gradients of, the values the embeddings' gradient alone is taken through)
MODELS = {
    "llama": (
        {},
        False,
        ["0.self_attn.attention_queries", "0.mlp.mlp_activation", "1.self_attn.attention_probabilities"],
        ["0.self_attn.attention_queries", "0.mlp.mlp_activation", "1.self_attn.attention_probabilities"],
        [],
    ),
    "qwen3_next": (
        {"num_attention_heads": 4, "num_key_value_heads": 2},
        True,
        [
            "0.linear_attn.attention_keys",
            "0.linear_attn.decays",
            "0.mlp.expert_outputs",
            "1.self_attn.attention_values",
        ],
        # nnsight 0.8's backward on this split model stops before any .grad is served, plain module outputs included
        [],
        [],
    ),
    # Each expert slot's output is a term of the sum the ranks all-reduce; nnsight 0.8 serves no .grad of it (nor in
    # one process), but the model's gradient passes back through it as served.
    "mixtral": ({}, False, ["0.mlp.expert_outputs"], ["1.self_attn.attention_probabilities"], ["0.mlp.expert_outputs"]),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def split(request, tmp_path_factory):
    """The checkpoint, what rank 0 of a two-rank run read from it, the values written, and a one-process load."""
    overrides, route, written, differentiated, through = MODELS[request.param]
    directory = save_tiny(request.param, str(tmp_path_factory.mktemp(request.param)), **overrides)
    out = tmp_path_factory.mktemp("rank0") / "read.pt"
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    # --standalone: a free port of its own, not 29500, which the previous run may still hold.
    command = [torchrun, "--standalone", "--nproc-per-node", "2", str(RANK), directory, str(out)]
    command += ["--route", *written] if route else written
    command += ["--gradients", *differentiated, "--through", *through]
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for _ in range(3):
        run = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
        # A rank aborted by gloo (seen in CI on a loaded machine) is the machine's, not a result: two retries.
        if run.returncode == 0 or "exitcode: -6" not in run.stderr:
            break
    assert run.returncode == 0, run.stderr[-4000:]
    model = StandardizedTransformer(directory, attn_implementation="eager")
    if route:
        route_kernels(model.family, "torch")
    yield torch.load(out), written, model
    if route:
        route_kernels(model.family, "default")


def test_every_value_is_served_whole_and_equal_to_one_process(split):
    read, _, model = split
    assert read["served"], "nothing was served under tensor parallelism"
    for key, reason in read["refused"].items():
        assert "tensor parallelism" not in reason, f"{key} is refused on the split model: {reason}"
        layer, name = key.split(".", 1)
        assert model.support(layer=int(layer))[name] == reason, f"{key} is refused only on the split model"
    for key, value in read["served"].items():
        layer, name = key.split(".", 1)
        with model.trace(PROMPT):
            whole = getattr(*block_value(model, int(layer), name)).save()
        if whole is None:
            assert value is None, f"{key}: served on rank 0 where one process has none"
            continue
        assert value.shape == whole.shape, f"{key}: {tuple(value.shape)} on rank 0, {tuple(whole.shape)} whole"
        close(value, whole, what=f"{key} on rank 0")


def test_a_write_gives_the_logits_one_process_gives(split):
    read, written, model = split
    with model.trace(PROMPT):
        clean = model.logits.save()
    for key in written:
        layer, name = key.split(".", 1)
        owner, value = block_value(model, int(layer), name)
        with model.trace(PROMPT):
            setattr(owner, value, getattr(owner, value) * 0.5)
            logits = model.logits.save()
        assert not torch.allclose(logits, clean), f"halving {key} changed nothing in one process"
        close(read["assigned"][key], logits, what=f"logits after assigning {key} on rank 0")
        close(read["edited"][key], logits, what=f"logits after editing {key} in place under no_grad on rank 0")


def test_decode_steps_are_served_whole_and_equal_to_one_process(split):
    read, written, model = split
    decoded, tokens = read["generated"]
    expected = []
    with model.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
        for _ in tracer.iter[0:3]:
            for key in written:
                layer, name = key.split(".", 1)
                expected.append(getattr(*block_value(model, int(layer), name)).save())
        generated = tracer.result.save()
    assert torch.equal(tokens, generated)
    assert len(decoded) == len(expected) == 3 * len(written)
    for index, (value, whole) in enumerate(zip(decoded, expected, strict=True)):
        close(value, whole, what=f"{written[index % len(written)]} on decode step {index // len(written)} on rank 0")


def test_gradients_reach_the_value_and_the_model_as_in_one_process(split):
    """The logits' gradient reaches each value read as in one process, and passes through it into the model: through a
    term of a sum too (an expert slot's output), whose own .grad nnsight serves in neither."""
    read, _, model = split
    if not read["gradients"]:
        pytest.skip("nnsight 0.8 serves no gradient on this split model, a plain module's output included")
    for key, (gradient, embedded) in read["gradients"].items():
        layer, name = key.split(".", 1)
        owner, value = block_value(model, int(layer), name)
        differentiated = gradient is not None
        with model.trace(PROMPT):
            embeddings = model.layers[0].layer_input
            served = getattr(owner, value)
            logits = model.logits
            with logits.sum().backward():
                expected = served.grad.save() if differentiated else None
                expected_embedded = embeddings.grad.save()
        if differentiated:
            close(gradient, expected, what=f"the gradient of the logits' sum on {key} on rank 0")
        scale = expected_embedded.abs().max().item()
        close(embedded / scale, expected_embedded / scale, what=f"the embeddings' gradient, with {key} read, on rank 0")


def test_a_split_module_called_on_a_whole_tensor_returns_it_whole(split):
    """nnsight's envoys for the split modules stay in place beside the standard ones."""
    read, _, model = split
    with model.trace(PROMPT):
        projected = model.lm_head(torch.ones(1, 3, model.hidden_size)).save()
    close(read["projected"], projected, what="lm_head called on rank 0")


@pytest.mark.skipif(
    Version(transformers.__version__) >= Version("5.19"), reason="nnsight traces expert parallelism from 5.19 on"
)
def test_expert_parallelism_before_5_19_is_refused_before_the_model_loads(tmp_path):
    from transformers.distributed import DistributedConfig

    directory = save_tiny("qwen3_next", str(tmp_path), num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(
        ValueError, match=r"expert parallelism \(enable_expert_parallel, ep_size\) needs transformers 5.19"
    ):
        StandardizedTransformer(directory, distributed_config=DistributedConfig(tp_size=2, enable_expert_parallel=True))
