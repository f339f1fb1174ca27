"""transformers 5.25's hub function modules: drilled through when they run transformers' Python, named when a hub kernel
replaces one.

From 5.25 transformers calls its recurrent kernels (and Mamba's scan helpers) through ``kernels``' function modules,
one copy per mixer module, which ``kernels.kernelize`` (``use_kernels=True``) may replace with a hub kernel. These
tests replace a copy's forward the way ``kernelize`` does, with a stand-in that runs the same Python, so the model
computes the same thing while nnterp must treat the function as a kernel it cannot read inside.
"""

from __future__ import annotations

import sys
from types import MethodType, SimpleNamespace

import pytest
import torch

from nnterp import Unavailable
from nnterp.forward_source import callee
from nnterp.testing import PROMPT, close, tiny_standardized

KERNELIZED = "kernels-community/stand-in"


def kernelize(module: torch.nn.Module, name: str) -> None:
    """What ``kernels.kernelize`` does to ``module``'s copy of the function module its forward calls as ``name``: a
    forward of a hub layer, and the repository it came from; the stand-in runs transformers' own function."""
    bound = getattr(sys.modules[type(module).__module__], name, None)
    if bound is None:
        pytest.skip(f"{type(module).__name__}'s forward calls no {name} in this transformers")
    copies = module.__dict__.get("_kernel_funcs", {}).values()
    copy = next((copy for copy in copies if type(copy) is type(bound)), None)
    if copy is None:
        pytest.skip(f"{type(module).__name__} calls {name} as a plain function here (no hub function modules)")
    function = callee(copy).function

    class StandIn(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return function(*args, **kwargs)

    copy.forward = MethodType(StandIn.forward, copy)
    copy.__dict__["_kernel_repo"] = SimpleNamespace(repo_id=KERNELIZED)


def test_a_kernelized_delta_rule_is_named_and_its_arguments_still_serve():
    clean = tiny_standardized("qwen3_5_text")
    model = tiny_standardized("qwen3_5_text")
    mixer = model.layers[0].linear_attn
    kernelize(mixer._module, "torch_chunk_gated_delta_rule")
    table = model.support(layer=0)
    reason = table["linear_attn.attention_head_outputs"]
    assert isinstance(reason, str) and KERNELIZED in reason and "use_kernels=True" in reason, reason
    assert table["linear_attn.state_trajectory"] is None
    with model.trace(PROMPT):
        with pytest.raises(Unavailable, match=KERNELIZED):
            mixer.attention_head_outputs.save()
    with model.trace(PROMPT):
        states = mixer.state_trajectory.save()
        logits = model.logits.save()
    with clean.trace(PROMPT):
        expected = clean.layers[0].linear_attn.state_trajectory.save()
        clean_logits = clean.logits.save()
    close(states, expected, what="state_trajectory beside a hub kernel")
    close(logits, clean_logits, what="logits")


def test_a_kernelized_scan_helper_makes_every_mixer_value_unavailable():
    """Mamba's scan runs inside ``mamba_scan_forward`` (5.25); replaced by a hub kernel, no kernel call is made."""
    model = tiny_standardized("mamba")
    mixer = model.layers[0].linear_attn
    kernelize(mixer._module, "mamba_scan_forward")
    table = model.support(layer=0)
    for value in ("attention_queries", "state_trajectory", "state_output"):
        reason = table[f"linear_attn.{value}"]
        assert isinstance(reason, str) and KERNELIZED in reason and "mamba_scan_forward" in reason, (value, reason)
    with model.trace(PROMPT):
        with pytest.raises(Unavailable, match="mamba_scan_forward"):
            mixer.state_trajectory.save()
    with model.trace(PROMPT):
        entering = model.layers[0].layer_input.save()
        contribution = mixer.attention_output.save()
        leaving = model.layers[0].layer_output.save()
    close(entering + contribution, leaving, what="layer_input + attention_output beside a hub kernel")
