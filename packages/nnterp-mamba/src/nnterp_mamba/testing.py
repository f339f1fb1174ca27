"""The conformance suite of a Mamba-1 mixer (``SelectiveScan``), for any family that has one.

A family's test file mixes it in beside the layer suite::

    class TestMamba(LayerSuite, SelectiveScanSuite):
        family = "mamba"

Every check recomputes something from served values and compares: the state
after every token against a selective scan rerun from the served x, step
sizes, decays, B and C; the last of those states against ``state_output``;
a decode step against one step of the scan from the state the prompt left;
and a state written at token t against the outputs before and after t.
"""

from __future__ import annotations

import unittest
from typing import ClassVar

import torch

from nnterp.testing import PROMPT, RecurrentMixerSuite, close

ATOL = 1e-5


def selective_scan_reference(
    x: torch.Tensor,
    betas: torch.Tensor,
    decays: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Mamba-1 recurrence over served values laid out tokens first; returns (states, y).

    ``x`` and ``betas`` are [batch, seq, channels], ``decays`` [batch, seq,
    channels, state_dim], ``B`` and ``C`` [batch, seq, groups, state_dim]
    (group g shared by the g-th run of ``channels // groups`` channels),
    ``D`` [channels]; ``state`` [batch, channels, state_dim] is where the scan
    starts (zeros when ``None``). Per token::

        h_t = exp(decays_t) * h_{t-1} + (betas_t * x_t) B_t
        y_t = C_t . h_t + D * x_t
    """
    batch, seq, channels = x.shape
    B, C = per_channel(B, channels), per_channel(C, channels)
    h = x.new_zeros(batch, channels, decays.shape[-1]) if state is None else state.float()
    states, outputs = [], []
    for t in range(seq):
        h = torch.exp(decays[:, t].float()) * h + (betas[:, t] * x[:, t]).float()[..., None] * B[:, t].float()
        states.append(h)
        outputs.append((h * C[:, t].float()).sum(-1) + D.float() * x[:, t].float())
    return torch.stack(states, 1), torch.stack(outputs, 1)


def per_channel(grouped: torch.Tensor, channels: int) -> torch.Tensor:
    """B or C [..., groups, state_dim] as every channel's, [..., channels, state_dim]: each group's for its run of channels."""
    return grouped.repeat_interleave(channels // grouped.shape[-2], dim=-2)


class SelectiveScanSuite(RecurrentMixerSuite):
    """A Mamba-1 mixer's values agree with the selective scan they come from, on a prompt and a decode step."""

    # a prompt's scan starts from zeros: a starting state is only a decode step's
    PROMPT_STATE_INPUT = False
    prompt_values: ClassVar[dict[int, dict[str, torch.Tensor]]]

    @classmethod
    def setup_class(cls) -> None:
        super().setup_class()
        cls.prompt_values = {}

    def walks_tokens(self, layer: int) -> bool:
        """Whether ``state`` is one place per token ``tracer.iter`` walks (not where each head's kernel call binds its
        own: Zamba's several Mamba heads); else ``state_after`` and ``set_state_after`` serve the same states."""
        return self.model.support(layer=layer)["linear_attn.state"] is None

    def seq_len(self) -> int:
        return len(self.model.tokenizer(PROMPT).input_ids)

    def read_prompt(self, layer: int) -> dict[str, torch.Tensor]:
        """Every value of a clean prompt through this block's mixer, read once per class (reads do not change the model)."""
        if layer not in self.prompt_values:
            self.prompt_values[layer] = self._read_prompt(layer)
        return self.prompt_values[layer]

    def _read_prompt(self, layer: int) -> dict[str, torch.Tensor]:
        mixer = self.model.layers[layer].linear_attn
        saved: dict[str, torch.Tensor] = {}  # bound outside: a name first bound inside a trace does not survive it
        with self.model.trace(PROMPT):
            saved["x"] = mixer.attention_values.save()
            saved["B"] = mixer.attention_keys.save()
            saved["C"] = mixer.attention_queries.save()
            saved["betas"] = mixer.betas.save()
            saved["decays"] = mixer.decays.save()
            saved["states"] = mixer.states.save()
            saved["y"] = mixer.attention_head_outputs.save()
            saved["state_output"] = mixer.state_output.save()
            saved["attention_output"] = mixer.attention_output.save()
        return saved

    # -- a prompt ---------------------------------------------------------------------

    def test_shapes_follow_the_layouts(self) -> None:
        seq = self.seq_len()
        for layer in self.recurrent_layers():
            mixer = self.model.layers[layer].linear_attn
            values = self.read_prompt(layer)
            channels, state_dim, groups = mixer.channels, mixer.state_dim, mixer.groups
            expected = {
                "x": (1, seq, channels),
                "B": (1, seq, groups, state_dim),
                "C": (1, seq, groups, state_dim),
                "betas": (1, seq, channels),
                "decays": (1, seq, channels, state_dim),
                "states": (1, seq, channels, state_dim),
                "y": (1, seq, channels),
                "state_output": (1, channels, state_dim),
                "attention_output": (1, seq, self.model.hidden_size),
            }
            for name, shape in expected.items():
                assert tuple(values[name].shape) == shape, (
                    f"layers[{layer}] {name}: {tuple(values[name].shape)} != {shape}"
                )

    def test_states_match_a_reference_scan_of_the_served_values(self) -> None:
        for layer in self.recurrent_layers():
            values = self.read_prompt(layer)
            # [channels]; Zamba keeps it per head, [heads, head_dim]
            D = self.model.layers[layer].linear_attn._module.D.detach().flatten()
            states, y = selective_scan_reference(
                values["x"], values["betas"], values["decays"], values["B"], values["C"], D
            )
            close(values["states"], states, ATOL, f"layers[{layer}] states vs a reference scan")
            close(values["y"], y, ATOL, f"layers[{layer}] attention_head_outputs vs C . h + D * x")

    def test_betas_are_positive_and_decays_non_positive(self) -> None:
        for layer in self.recurrent_layers():
            values = self.read_prompt(layer)
            assert (values["betas"] > 0).all(), f"layers[{layer}] a step size is not positive"
            assert (values["decays"] <= 0).all(), f"layers[{layer}] a log decay is positive"

    def test_last_state_is_state_output(self) -> None:
        for layer in self.recurrent_layers():
            values = self.read_prompt(layer)
            assert torch.equal(values["states"][:, -1], values["state_output"]), (
                f"layers[{layer}] states[:, -1] != state_output"
            )

    def test_state_after_token_is_that_tokens_state(self) -> None:
        seq = self.seq_len()
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        walked: list[torch.Tensor] = []
        if self.walks_tokens(layer):
            with self.model.trace(PROMPT) as tracer:
                for _ in tracer.iter[:seq]:
                    walked.append(mixer.state.save())
        with self.model.trace(PROMPT):
            states = mixer.states.save()
        with self.model.trace(PROMPT):  # states walks every token, so a later position is read in a trace of its own
            middle = mixer.state_after(seq // 2).save()
        if self.walks_tokens(layer):
            assert len(walked) == seq, f"tracer.iter walked {len(walked)} of the prompt's {seq} tokens"
        for t, state in enumerate(walked):
            assert torch.equal(state, states[:, t]), f"layers[{layer}] state at token {t} != states[:, {t}]"
        assert torch.equal(middle, states[:, seq // 2]), "state_after(t) != states[:, t]"

    # -- writes -------------------------------------------------------------------------

    def test_state_write_changes_outputs_from_its_token_on(self) -> None:
        seq = self.seq_len()
        token = seq // 2
        for layer in self.recurrent_layers():
            mixer = self.model.layers[layer].linear_attn
            clean = self.read_prompt(layer)
            zeros = torch.zeros_like(clean["state_output"])
            if self.walks_tokens(layer):
                with self.model.trace(PROMPT) as tracer:
                    for _ in tracer.iter[token]:
                        mixer.state = zeros
                    for _ in tracer.iter[token + 1]:
                        following = mixer.state.save()
                    written = mixer.attention_output.save()
            else:
                # each head's kernel call passes every token before the next head's starts: after the write, the
                # state after token + 1 is seen through the head outputs that read it
                with self.model.trace(PROMPT):
                    mixer.set_state_after(token, zeros)
                    reading = mixer.attention_head_outputs.save()
                    written = mixer.attention_output.save()
            close(
                written[:, :token],
                clean["attention_output"][:, :token],
                ATOL,
                f"layers[{layer}] outputs before the write",
            )
            for t in (token, token + 1):
                assert not torch.allclose(written[:, t], clean["attention_output"][:, t]), (
                    f"layers[{layer}] zeroing the state after token {token} left the output at {t} unchanged"
                )
            # Far from the write the zeroed state has decayed below allclose's tolerance; it still differs.
            assert not torch.equal(written[:, -1], clean["attention_output"][:, -1]), (
                f"layers[{layer}] zeroing the state after token {token} left the last output unchanged"
            )
            step = clean["betas"][:, token + 1] * clean["x"][:, token + 1]
            restarted = step[..., None] * per_channel(clean["B"][:, token + 1], step.shape[-1])
            what = f"layers[{layer}] the state after token {token + 1} continues from the written zeros"
            if self.walks_tokens(layer):
                close(following, restarted, ATOL, what)
            else:
                D = mixer._module.D.detach().flatten()
                C = per_channel(clean["C"][:, token + 1], step.shape[-1])
                close(reading[:, token + 1], (restarted * C).sum(-1) + D * clean["x"][:, token + 1], ATOL, what)

    def test_set_state_after_is_the_same_write(self) -> None:
        token = self.seq_len() // 2
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        if not self.walks_tokens(layer):
            raise unittest.SkipTest(
                "state, one place per token, is unavailable here: the state write test writes set_state_after"
            )
        with self.model.trace(PROMPT) as tracer:
            for _ in tracer.iter[token]:
                mixer.state = torch.zeros_like(mixer.state)
            by_iteration = mixer.attention_output.save()
        zeros = torch.zeros(1, mixer.channels, mixer.state_dim)
        with self.model.trace(PROMPT):
            mixer.set_state_after(token, zeros)
            by_call = mixer.attention_output.save()
        close(by_call, by_iteration, ATOL, f"layers[{layer}] set_state_after vs a write under tracer.iter")

    def test_zero_queries_leave_only_the_skip(self) -> None:
        for layer in self.recurrent_layers():
            mixer = self.model.layers[layer].linear_attn
            D = mixer._module.D.detach().flatten()
            with self.model.trace(PROMPT):
                mixer.attention_queries = torch.zeros_like(mixer.attention_queries)
                x = mixer.attention_values.save()
                y = mixer.attention_head_outputs.save()
            close(y, D * x, ATOL, f"layers[{layer}] attention_head_outputs with C = 0 vs D * x")

    def test_in_place_edit_reaches_the_kernel(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        with self.model.trace(PROMPT):
            mixer.attention_values[:, -1] = 0
            x = mixer.attention_values.save()
            y = mixer.attention_head_outputs.save()
            state = mixer.state_output.save()
        clean = self.read_prompt(layer)
        assert torch.count_nonzero(x[:, -1]) == 0
        close(y[:, :-1], clean["y"][:, :-1], ATOL, f"layers[{layer}] outputs before the edited token")
        decay = torch.exp(clean["decays"][:, -1])
        close(
            state, decay * clean["states"][:, -2], ATOL, f"layers[{layer}] a token writing x = 0 only decays the state"
        )

    def test_betas_and_decays_are_read_only(self) -> None:
        mixer = self.model.layers[self.recurrent_layers()[0]].linear_attn
        for name in ("betas", "decays"):
            try:
                with self.model.trace(PROMPT):
                    setattr(mixer, name, torch.zeros(1))
            except AttributeError as error:
                assert "derived" in str(error), f"{name}: {error}"
            else:
                raise AssertionError(f"assigning {name} did not raise")

    def test_mixer_adds_to_the_residual_stream(self) -> None:
        for layer in self.recurrent_layers():
            block = self.model.layers[layer]
            with self.model.trace(PROMPT):
                entering = block.layer_input.save()
                added = block.linear_attn.attention_output.save()
                mid = (block.layer_mid if getattr(block, "mlp", None) is not None else block.layer_output).save()
            close(entering + added, mid, ATOL, f"layers[{layer}] layer_input + linear_attn.attention_output")

    # -- decoding -----------------------------------------------------------------------

    def test_decode_step_continues_from_the_prompts_state(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        D = mixer._module.D.detach().flatten()
        prompt_state: list[torch.Tensor] = []
        step: dict[str, torch.Tensor] = {}
        with self.model.generate(PROMPT, max_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[0]:
                assert mixer.state_input is None
                prompt_state.append(mixer.state_output.save())
            for _ in tracer.iter[1]:
                step["entering"] = mixer.state_input.save()
                step["x"] = mixer.attention_values.save()
                step["B"] = mixer.attention_keys.save()
                step["C"] = mixer.attention_queries.save()
                step["betas"] = mixer.betas.save()
                step["decays"] = mixer.decays.save()
                step["leaving"] = mixer.state_output.save()
                step["y"] = mixer.attention_head_outputs.save()
        assert torch.equal(step["entering"], prompt_state[0]), (
            "the decode step does not start from the prompt's state_output"
        )
        assert tuple(step["x"].shape) == (1, 1, mixer.channels)
        states, y = selective_scan_reference(
            step["x"], step["betas"], step["decays"], step["B"], step["C"], D, state=step["entering"]
        )
        close(step["leaving"], states[:, 0], ATOL, "the decode step's state_output vs one step of the scan")
        close(step["y"], y, ATOL, "the decode step's attention_head_outputs vs one step of the scan")

    def test_written_state_output_is_where_the_next_step_starts(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        entering: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[0]:
                mixer.state_output = torch.full_like(mixer.state_output, 0.25)
            for _ in tracer.iter[1]:
                entering.append(mixer.state_input.save())
        close(
            entering[0],
            torch.full_like(entering[0], 0.25),
            ATOL,
            "the next step's state_input after writing state_output",
        )
