"""The conformance suite of a gated short convolution (``ShortConv``), for any family that has one.

A family's test file mixes it in beside the layer suite::

    class TestLfm2(LayerSuite, ShortConvSuite):
        family = "lfm2"

Every check recomputes something from served values and compares: the conv
outputs against a convolution written from its equations in float64 over the
served ``conv_input``; the gated output against transformers' own forward;
the window after every token against the served inputs; a decode step against
the window the prompt left; a written window against the tokens before, in
and after its reach; the token mixing against the head outputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from nnterp.analysis import knock_out, patch_state
from nnterp.analysis.mixing import mixed
from nnterp.order import OrderError
from nnterp.testing import PROMPT, blocks_with, close
from nnterp.testing.mixing import TokenMixingSuite
from nnterp.testing.order import TraceOrderSuite
from nnterp.testing.suites import raises

ATOL = 1e-5
#: A left-padded batch: the shorter prompt's pads reach the conv as zeros.
BATCH = ["a b c d e f", "c d"]


def reference_conv(
    inputs: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None, entering: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A depthwise causal convolution as a loop over tokens, float64; returns (windows, outputs).

    ``inputs`` is [batch, seq, channels] (tokens first, as served),
    ``weights`` [channels, k], ``entering`` the window [batch, channels, k]
    before the first token (zeros when ``None``). Per token::

        W_t = (W_{t-1}[1:], u_t)
        conv_t = bias + sum_i w[i] * W_t[i]
    """
    inputs, weights = inputs.double(), weights.double()
    batch, seq, channels = inputs.shape
    k = weights.shape[-1]
    window = inputs.new_zeros(batch, channels, k) if entering is None else entering.double()
    windows, outputs = [], []
    for t in range(seq):
        window = torch.cat([window[..., 1:], inputs[:, t, :, None]], dim=-1)
        output = (window * weights).sum(-1)
        if bias is not None:
            output = output + bias.double()
        windows.append(window)
        outputs.append(output)
    return torch.stack(windows, 1), torch.stack(outputs, 1)


class ShortConvSuite(TokenMixingSuite, TraceOrderSuite):
    """A gated short convolution's values agree with the convolution they come from, on prompts and decode steps."""

    prompt_values: ClassVar[dict[int, dict[str, torch.Tensor]]]

    @classmethod
    def setup_class(cls) -> None:
        super().setup_class()
        cls.prompt_values = {}

    def conv_layers(self) -> list[int]:
        layers = blocks_with(self.model, "linear_attn")
        assert layers, f"{self.family}'s tiny config builds no conv block"
        return layers

    def recurrent_layers(self) -> list[int]:
        """The conv blocks, under the name the core suites ask for."""
        return self.conv_layers()

    def order_layer(self) -> int:
        """The block the trace-order suite tries its pairs on: the first conv block."""
        return self.conv_layers()[0]

    @contextmanager
    def per_token_states(self) -> Iterator[None]:
        """The windows are always served: nothing to turn on."""
        yield

    def mixer(self, layer: int) -> Any:
        return self.model.layers[layer].linear_attn

    def seq_len(self) -> int:
        return len(self.model.tokenizer(PROMPT).input_ids)

    def parameters(self, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        conv = self.mixer(layer)._module.conv
        return conv.weight.detach()[:, 0], None if conv.bias is None else conv.bias.detach()

    @contextmanager
    def strong_filters(self, layer: int) -> Iterator[None]:
        """The layer's conv filters scaled up, so a tiny random model's window changes show far above rounding."""
        weight = self.mixer(layer)._module.conv.weight
        saved = weight.detach().clone()
        with torch.no_grad():
            weight.mul_(50)
        try:
            yield
        finally:
            with torch.no_grad():
                weight.copy_(saved)

    def read_prompt(self, layer: int) -> dict[str, torch.Tensor]:
        """Every value of a clean prompt through this block's mixer, read once per class."""
        if layer not in self.prompt_values:
            mixer = self.mixer(layer)
            saved: dict[str, torch.Tensor] = {}
            with self.model.trace(PROMPT):
                saved["B"] = mixer.attention_keys.save()
                saved["C"] = mixer.attention_queries.save()
                saved["x"] = mixer.attention_values.save()
                saved["u"] = mixer.conv_input.save()
                saved["decays"] = mixer.decays.save()
                saved["states"] = mixer.states.save()
                saved["h"] = mixer.attention_head_outputs.save()
                saved["state_output"] = mixer.state_output.save()
                saved["attention_output"] = mixer.attention_output.save()
            self.prompt_values[layer] = saved
        return self.prompt_values[layer]

    # -- a prompt ---------------------------------------------------------------------

    def test_shapes_follow_the_layouts(self) -> None:
        seq = self.seq_len()
        for layer in self.conv_layers():
            mixer, values = self.mixer(layer), self.read_prompt(layer)
            channels, k = mixer.channels, mixer.conv_window
            expected = {
                "B": (1, seq, channels),
                "C": (1, seq, channels),
                "x": (1, seq, channels),
                "u": (1, seq, channels),
                "decays": (channels, k),
                "states": (1, seq, channels, k),
                "h": (1, seq, channels),
                "state_output": (1, channels, k),
                "attention_output": (1, seq, self.model.hidden_size),
            }
            for name, shape in expected.items():
                assert tuple(values[name].shape) == shape, f"layers[{layer}] {name}: {tuple(values[name].shape)}"

    def test_conv_input_is_the_input_gate_times_the_values(self) -> None:
        for layer in self.conv_layers():
            values = self.read_prompt(layer)
            close(values["u"], values["B"] * values["x"], ATOL, f"layers[{layer}] conv_input vs B * x")

    def test_head_outputs_and_windows_match_a_reference_convolution(self) -> None:
        for layer in self.conv_layers():
            values = self.read_prompt(layer)
            weights, bias = self.parameters(layer)
            assert torch.equal(values["decays"], weights), f"layers[{layer}] decays are not the conv filters"
            windows, outputs = reference_conv(values["u"], weights, bias)
            close(values["h"].double(), outputs, ATOL, f"layers[{layer}] attention_head_outputs vs the convolution")
            assert torch.equal(values["states"].double(), windows), f"layers[{layer}] states vs the windows"
            assert torch.equal(values["states"][:, -1], values["state_output"]), "states[:, -1] != state_output"

    def test_gated_output_is_transformers_own(self) -> None:
        """out_proj(C * conv) over the served values is what the module returns in a plain forward, no nnsight."""
        for layer in self.conv_layers():
            values = self.read_prompt(layer)
            module = self.mixer(layer)._module
            captured: dict[str, torch.Tensor] = {}
            hook = module.register_forward_hook(lambda _m, _i, output, into=captured: into.setdefault("out", output))
            try:
                ids = self.model.tokenizer(PROMPT, return_tensors="pt").input_ids
                with torch.no_grad():
                    self.model._module(ids)
            finally:
                hook.remove()
            gated = module.out_proj(values["C"] * values["h"])
            close(gated, captured["out"], ATOL, f"layers[{layer}] out_proj(C * conv) vs transformers' forward")
            if type(self.mixer(layer)).CONTRIBUTION == "output":
                close(values["attention_output"], captured["out"], ATOL, f"layers[{layer}] attention_output")

    def test_state_after_and_trajectory_positions_are_the_states(self) -> None:
        layer = self.conv_layers()[0]
        mixer, seq = self.mixer(layer), self.seq_len()
        states = self.read_prompt(layer)["states"]
        with self.model.trace(PROMPT):
            middle = mixer.state_after(seq // 2).save()
            picked = mixer.trajectory(positions=[seq - 1, 0]).save()
            trajectory = mixer.state_trajectory.save()
        assert torch.equal(middle, states[:, seq // 2]), "state_after(t) != states[:, t]"
        assert torch.equal(picked, states[:, [seq - 1, 0]]), "trajectory(positions=) != states[:, positions]"
        assert torch.equal(trajectory, states), "state_trajectory != states"

    def test_a_padded_batch_serves_each_prompts_windows(self) -> None:
        for layer in self.conv_layers():
            mixer = self.mixer(layer)
            with self.model.trace(BATCH):
                u = mixer.conv_input.save()
                states = mixer.states.save()
                h = mixer.attention_head_outputs.save()
                final = mixer.state_output.save()
            weights, bias = self.parameters(layer)
            windows, outputs = reference_conv(u, weights, bias)
            assert torch.equal(states.double(), windows) and torch.equal(states[:, -1], final)
            close(h.double(), outputs, ATOL, f"layers[{layer}] a padded batch's conv outputs")

    # -- writes -------------------------------------------------------------------------

    def test_a_window_write_changes_the_next_k_minus_1_tokens_and_no_others(self) -> None:
        seq = self.seq_len()
        token = 1
        for layer in self.conv_layers():
            mixer = self.mixer(layer)
            k = mixer.conv_window
            assert token + k < seq, "the prompt must reach past the written window"
            with self.strong_filters(layer):
                with self.model.trace(PROMPT):
                    u = mixer.conv_input.save()
                    clean = mixer.attention_head_outputs.save()
                written_window = torch.ones(1, mixer.channels, k)
                with self.model.trace(PROMPT):
                    mixer.set_state_after(token, written_window)
                    written = mixer.attention_head_outputs.save()
                    final = mixer.state_output.save()
                weights, bias = self.parameters(layer)
                _, continued = reference_conv(u[:, token + 1 :], weights, bias, entering=written_window)
            reach = slice(token + 1, token + k)
            close(written[:, : token + 1], clean[:, : token + 1], ATOL, f"layers[{layer}] tokens up to the write")
            close(written[:, token + k :], clean[:, token + k :], ATOL, f"layers[{layer}] tokens past its reach")
            assert (written[:, reach] - clean[:, reach]).abs().amax() > 1e-3, "the write did not reach the next tokens"
            close(written[:, reach].double(), continued[:, : k - 1], ATOL, f"layers[{layer}] continued from the write")
            # the written window is out of the cache's reach: the window it keeps is the clean one
            assert torch.equal(final, self.read_prompt(layer)["state_output"]), (
                "a write before the end reached the cache"
            )

    def test_a_write_at_the_last_token_is_the_window_the_cache_keeps(self) -> None:
        layer = self.conv_layers()[0]
        mixer, seq = self.mixer(layer), self.seq_len()
        window = torch.full((1, mixer.channels, mixer.conv_window), 0.5)
        with self.model.trace(PROMPT):
            mixer.set_state_after(seq - 1, window)
            final = mixer.state_output.save()
        assert torch.equal(final, window), "set_state_after(last token) is not the state the cache keeps"

    def test_wrong_writes_and_late_reads_raise_before_the_model_runs_on(self) -> None:
        layer = self.conv_layers()[0]
        mixer = self.mixer(layer)
        with raises(ValueError, "conv_window"):
            with self.model.trace(PROMPT):
                mixer.set_state_after(1, torch.zeros(1, mixer.channels + 1, mixer.conv_window))
        with raises(OrderError, "attention_keys"):
            with self.model.trace(PROMPT):
                mixer.attention_head_outputs.save()
                mixer.attention_keys.save()
        with raises(OrderError, "set_state_after"):
            with self.model.trace(PROMPT):
                mixer.attention_head_outputs.save()
                mixer.set_state_after(1, torch.zeros(1, mixer.channels, mixer.conv_window))
        with raises(ValueError, "state_input"):
            with self.model.trace(PROMPT):
                mixer.state_input = torch.zeros(1, mixer.channels, mixer.conv_window)

    def test_a_gate_write_reaches_the_conv_and_the_output(self) -> None:
        layer = self.conv_layers()[0]
        mixer = self.mixer(layer)
        with self.model.trace(PROMPT):
            mixer.attention_keys = mixer.attention_keys * 0
            u = mixer.conv_input.save()
            h = mixer.attention_head_outputs.save()
        _, bias = self.parameters(layer)
        assert torch.equal(u, torch.zeros_like(u)), "B = 0 did not zero the conv input"
        expected = torch.zeros_like(h) if bias is None else bias.expand_as(h)
        close(h, expected, ATOL, "the conv of zero inputs")

    # -- decode steps -------------------------------------------------------------------

    def generate(self, layer: int, steps: int = 3, write: torch.Tensor | None = None) -> dict[str, list]:
        mixer = self.mixer(layer)
        read: dict[str, list] = {"in": [], "x": [], "u": [], "h": [], "out": [], "M": [], "offset": []}
        with self.model.generate(PROMPT, max_new_tokens=steps, min_new_tokens=steps, do_sample=False) as tracer:
            for step in tracer.iter[:steps]:
                read["in"].append(mixer.state_input.save())
                read["x"].append(mixer.attention_values.save())
                read["u"].append(mixer.conv_input.save())
                read["M"].append(mixer.token_mixing().save())
                read["offset"].append(mixer.mixing_offset().save())
                read["h"].append(mixer.attention_head_outputs.save())
                read["out"].append(mixer.state_output.save())
                if write is not None and step == 0:
                    mixer.state_output = write
        return read

    def test_decode_steps_continue_from_the_prompts_window(self) -> None:
        for layer in self.conv_layers():
            read = self.generate(layer)
            weights, bias = self.parameters(layer)
            assert read["in"][0] is None, "a prompt from an empty cache has no state_input"
            for step in (1, 2):
                assert torch.equal(read["in"][step], read["out"][step - 1]), f"step {step} starts elsewhere"
                windows, outputs = reference_conv(read["u"][step], weights, bias, entering=read["in"][step])
                assert torch.equal(read["out"][step].double(), windows[:, -1]), f"step {step} window"
                close(read["h"][step].double(), outputs, ATOL, f"layers[{layer}] step {step} conv output")

    def test_a_state_output_write_is_where_the_next_step_starts(self) -> None:
        layer = self.conv_layers()[0]
        mixer = self.mixer(layer)
        written = torch.full((1, mixer.channels, mixer.conv_window), 2.0)
        read = self.generate(layer, steps=2, write=written)
        weights, bias = self.parameters(layer)
        assert torch.equal(read["in"][1], written), "the next step does not start from the written state_output"
        _, outputs = reference_conv(read["u"][1], weights, bias, entering=written)
        close(read["h"][1].double(), outputs, ATOL, "the step's conv output after the write")

    def test_a_state_input_write_is_the_window_a_decode_step_convolves(self) -> None:
        layer = self.conv_layers()[0]
        mixer = self.mixer(layer)
        written = torch.full((1, mixer.channels, mixer.conv_window), -1.0)
        read: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1]:
                mixer.state_input = written
                read.append(mixer.conv_input.save())
                read.append(mixer.attention_head_outputs.save())
                read.append(mixer.state_output.save())
                read.append(mixer.state_trajectory.save())
        u, h, final, trajectory = read
        weights, bias = self.parameters(layer)
        windows, outputs = reference_conv(u, weights, bias, entering=written)
        close(h.double(), outputs, ATOL, "the decode step's conv output over the written window")
        assert torch.equal(final.double(), windows[:, -1]), "the window kept after the step"
        assert torch.equal(trajectory.double(), windows), "state_trajectory starts from the written state_input"

    # -- analyses -------------------------------------------------------------------------

    def test_a_knocked_out_token_leaves_the_window_for_k_tokens(self) -> None:
        layer = self.conv_layers()[0]
        mixer, token = self.mixer(layer), 1
        k = mixer.conv_window
        clean = self.read_prompt(layer)
        with self.model.trace(PROMPT):
            knock_out(self.model, [token], layers=[layer])
            u = mixer.conv_input.save()
            h = mixer.attention_head_outputs.save()
        assert torch.equal(u[:, token], torch.zeros_like(u[:, token])), "the knocked token still writes"
        close(h[:, :token], clean["h"][:, :token], ATOL, "conv outputs before the knocked token")
        close(h[:, token + k :], clean["h"][:, token + k :], ATOL, "conv outputs past the window's reach")
        assert (h[:, token : token + k] - clean["h"][:, token : token + k]).abs().amax() > 0, "no token lost it"

    def test_patching_a_prompts_own_windows_changes_nothing_and_anothers_does(self) -> None:
        layers = self.conv_layers()
        positions = [1, 5]
        same = patch_state(self.model, PROMPT, PROMPT, positions, layers=layers)
        other = patch_state(self.model, "f e d c b a", PROMPT, positions, layers=layers)
        assert same.abs().max() <= ATOL, "patching the prompt's own windows changed its logits"
        assert (other.abs().amax(-1) > 0).all(), "another prompt's windows changed nothing"

    # -- token mixing ---------------------------------------------------------------------

    def test_token_mixing_reconstructs_the_head_outputs(self) -> None:
        for layer in self.conv_layers():
            mixer = self.mixer(layer)
            for prompt in (PROMPT, BATCH):
                with self.model.trace(prompt):
                    x = mixer.attention_values.save()
                    M = mixer.token_mixing().save()
                    offset = mixer.mixing_offset().save()
                    h = mixer.attention_head_outputs.save()
                close(mixed(M, x) + offset, h, ATOL, f"layers[{layer}] token mixing on {prompt!r}")
                k = mixer.conv_window
                lag = torch.arange(M.shape[-2])[:, None] - torch.arange(M.shape[-1])
                assert (M[..., (lag < 0) | (lag >= k)] == 0).all(), "the mixing reaches outside the conv's band"
            read = self.generate(layer)
            for step in range(3):
                rebuilt = mixed(read["M"][step], read["x"][step]) + read["offset"][step]
                close(rebuilt, read["h"][step], ATOL, f"layers[{layer}] token mixing on decode step {step}")
