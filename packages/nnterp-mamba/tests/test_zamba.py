"""Zamba: Mamba-1 blocks around hybrid blocks whose shared transformer feeds their mixer."""

import ast

import pytest
import torch

from nnterp import Unavailable
from nnterp.testing import PROMPT, ForwardChangeSuite, close, family_suite
from nnterp_mamba.testing import SelectiveScanSuite


class TestZamba(family_suite("zamba")):
    pass


class TestZambaTwoMambaHeads(SelectiveScanSuite):
    """Two Mamba heads, two scan calls per forward, as real checkpoints have: every head a group of channels."""

    family = "zamba"
    load = {"n_mamba_heads": 2}

    def test_each_head_scans_its_own_channels_with_its_own_B_and_C(self) -> None:
        """y of each head's channels is the scan of those channels alone, with that head's group of B and C."""
        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        values = self.read_prompt(layer)
        D = mixer._module.D.detach().flatten()
        width = mixer.head_dim
        assert mixer.groups == 2 and width * 2 == mixer.channels
        for head in range(2):
            channels = slice(head * width, (head + 1) * width)
            h = torch.zeros(1, width, mixer.state_dim)
            for t in range(self.seq_len()):
                h = torch.exp(values["decays"][:, t, channels]) * h
                h = (
                    h
                    + (values["betas"][:, t, channels] * values["x"][:, t, channels])[..., None]
                    * values["B"][:, t, head]
                )
                y = (h * values["C"][:, t, head]).sum(-1) + D[channels] * values["x"][:, t, channels]
                close(values["y"][:, t, channels], y, 1e-5, f"head {head}'s y at token {t}")
            close(values["state_output"][:, channels], h, 1e-5, f"head {head}'s final state")
        assert not torch.allclose(values["B"][:, :, 0], values["B"][:, :, 1]), "the two heads share one B"

    def test_a_written_head_output_reaches_only_its_channels(self) -> None:
        """With one head's y zeroed the output is the other head's alone: out_proj has no bias, so the two add up."""
        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        width = mixer.head_dim
        assert mixer._module.out_proj.bias is None
        outputs: list[torch.Tensor] = []
        for head in range(2):
            with self.model.trace(PROMPT):
                mixer.attention_head_outputs[:, :, head * width : (head + 1) * width] = 0
                outputs.append(mixer.attention_output.save())
        clean = self.read_prompt(layer)
        for head, output in enumerate(outputs):
            assert not torch.allclose(output, clean["attention_output"]), f"zeroing head {head}'s y changed nothing"
        close(outputs[0] + outputs[1], clean["attention_output"], 1e-5, "the two heads' outputs vs the whole")
        with self.model.trace(PROMPT):
            y = mixer.attention_head_outputs
            mixer.attention_head_outputs = torch.cat([torch.zeros_like(y[..., :width]), y[..., width:]], -1)
            assigned = mixer.attention_output.save()
        close(assigned, outputs[0], 1e-6, "an assigned head output vs the same edit in place")

    def test_state_is_refused_per_token_walk(self) -> None:
        """Each head's kernel call binds its own state after a token: state, one place per token, says so."""
        layer = self.recurrent_layers()[0]
        reason = self.model.support(layer=layer)["linear_attn.state"]
        assert reason is not None and "once per head (n_mamba_heads=2)" in reason, reason
        with pytest.raises(Unavailable, match=r"state on layers\[\d+\]\.linear_attn: .* once per head"):
            with self.model.trace(PROMPT):
                self.mixer(layer).state.save()


class _InMixerForward(ast.NodeTransformer):
    """``old`` (a name, or a dotted ``torch.<function>``) spelled ``new`` inside ``ZambaMambaMixer.forward`` only."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        if node.name != "ZambaMambaMixer":
            return node
        forward = next(item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "forward")
        for inner in ast.walk(forward):
            if isinstance(inner, ast.Name) and inner.id == self.old:
                inner.id = self.new
            elif isinstance(inner, ast.Attribute) and ast.unparse(inner) == self.old:
                inner.attr = self.new.rsplit(".", 1)[-1]
        return node


class TestZambaForwardChange(ForwardChangeSuite):
    """A changed kernel call, or a changed place the mixer reads around its loop over heads, is a sentence."""

    family = "zamba"
    load = {"n_mamba_heads": 2}

    @pytest.mark.parametrize(
        ("old", "new"),
        [
            ("hidden_states_B_C", "hidden_states_B_C_v2"),  # every head's x, read before the loop
            ("recurrent_state", "recurrent_state_v2"),  # the cache's state a decode step starts from
            ("torch.cat", "torch.concat"),  # the join of the heads' outputs after the loop
        ],
    )
    def test_a_changed_place_around_the_head_loop_is_named(self, old: str, new: str) -> None:
        """As a changed kernel call: every recurrent value unavailable with the family, the version and what was
        expected, nnterp check saying so, the mixer's output unchanged."""
        layer = self._mixer_layer(self.model)
        with self.changed(_InMixerForward(old, new), "changed_place") as model:
            self._assert_named(model, f"`{old}`")
            with model.trace(PROMPT):
                changed = model.layers[layer].linear_attn.attention_output.save()
        with self.model.trace(PROMPT):
            clean = self.model.layers[layer].linear_attn.attention_output.save()
        close(changed, clean, what="the changed forward's attention_output vs the installed one's")
