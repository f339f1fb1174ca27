"""A model split by transformers' tensor parallelism serves every value whole or refuses it, never one rank's slice.

``torchrun --nproc-per-node 2`` on the CPU (gloo) runs ``tensor_parallel_rank.py``
on a tiny Llama with two key/value heads; what rank 0 read is compared with
one process reading the same checkpoint. The values on the residual stream and
the sublayers' outputs come back whole and equal; those laid out over a split
axis (heads, the MLP's neurons) are refused with the reason; a write, by
assignment or in place under ``torch.no_grad()``, gives the logits one process
gives, and a split module called on a whole tensor returns it whole.
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

from nnterp import StandardizedTransformer
from nnterp.tensor_parallel import WHOLE_AXES
from nnterp.testing import PROMPT, close, save_tiny

RANK = pathlib.Path(__file__).with_name("tensor_parallel_rank.py")

pytestmark = pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.19"),
    reason="nnsight 0.8 runs tensor parallelism on transformers 5.19 and later only",
)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The checkpoint, and what rank 0 of a two-rank run read from it."""
    directory = save_tiny("llama", str(tmp_path_factory.mktemp("llama")))
    out = tmp_path_factory.mktemp("rank0") / "read.pt"
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    # --standalone: a free port of its own, not 29500, which the previous run may still hold.
    command = [torchrun, "--standalone", "--nproc-per-node", "2", str(RANK), directory, str(out)]
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for _ in range(2):
        run = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
        # A rank aborted by gloo as it starts (seen once in CI) is the machine's, not a result: one retry.
        if run.returncode == 0 or "exitcode: -6" not in run.stderr:
            break
    assert run.returncode == 0, run.stderr[-4000:]
    return directory, torch.load(out)


def test_served_values_are_whole_and_equal_one_process(split):
    directory, read = split
    model = StandardizedTransformer(directory, attn_implementation="eager")
    assert read["served"], "nothing was served under tensor parallelism"
    for key, value in read["served"].items():
        layer, name = key.split(".", 1)
        owner, _, attribute = name.rpartition(".")
        block = model.layers[int(layer)]
        with model.trace(PROMPT):
            whole = getattr(getattr(block, owner) if owner else block, attribute).save()
        assert value.shape == whole.shape, f"{key}: {tuple(value.shape)} on rank 0, {tuple(whole.shape)} whole"
        close(value, whole, what=f"{key} on rank 0")


def test_values_over_a_split_axis_are_refused_with_the_reason(split):
    directory, read = split
    model = StandardizedTransformer(directory, attn_implementation="eager")
    for key in list(read["served"]) + list(read["refused"]):
        layer, name = key.split(".", 1)
        owner, _, attribute = name.rpartition(".")
        block = model.layers[int(layer)]
        dims = type(getattr(block, owner) if owner else block).values()[attribute].dims
        if set(dims) <= WHOLE_AXES:
            assert key in read["served"], f"{key} ({dims}) is whole on every rank but was refused"
        else:
            assert key in read["refused"], f"{key} ({dims}) is split across ranks but was served"
            assert "tensor parallelism" in read["refused"][key] and "2 ranks" in read["refused"][key]
    assert any(".self_attn.attention_probabilities" in key for key in read["refused"])


def test_a_write_gives_the_logits_one_process_gives(split):
    directory, read = split
    model = StandardizedTransformer(directory, attn_implementation="eager")
    with model.trace(PROMPT):
        model.layers[0].mlp.mlp_output = model.layers[0].mlp.mlp_output * 0.5
        written = model.logits.save()
    with model.trace(PROMPT):
        clean = model.logits.save()
    assert not torch.allclose(written, clean)
    close(read["written"], written, what="logits after assigning mlp_output on rank 0")
    close(read["edited"], written, what="logits after editing mlp_output in place under no_grad on rank 0")


def test_a_split_module_called_on_a_whole_tensor_returns_it_whole(split):
    """nnsight's envoys for the split modules stay in place beside the standard ones (a row-parallel down_proj)."""
    directory, read = split
    model = StandardizedTransformer(directory, attn_implementation="eager")
    mlp = model.layers[0].mlp
    with model.trace(PROMPT):
        projected = mlp.down_proj(torch.ones(1, 3, mlp.intermediate_size)).save()
    close(read["projected"], projected, what="down_proj called on rank 0")
