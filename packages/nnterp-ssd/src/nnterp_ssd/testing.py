"""SSDSuite: the properties every Mamba-2 (StateSpace) mixer's values must have, reusable by any family.

A family's test file mixes it in with the other suites of its blocks::

    class TestMamba2(LayerSuite, SSDSuite):
        family = "mamba2"

Every check recomputes something from served values: the state after every
token from the served ``x``, ``B``, ``C``, ``betas`` and ``decays`` by the SSD
recurrence, the decode step's state from the state it was handed, the state
a written gate or a written initial state leads to.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from nnterp import Unavailable
from nnterp.components.routing import route_kernels
from nnterp.testing import PROMPT, RecurrentMixerSuite, close

from .state_space import NO_STATE_OCCURRENCES, NO_STATE_WRITES, StateSpace, chunk_per_token

#: The values read at the kernel's arguments, then the ones read inside it and at its outputs, in the order a read must follow.
ARGUMENT_VALUES = ("attention_queries", "attention_keys", "attention_values", "betas", "decays", "state_input")
RESULT_VALUES = ("states", "state_output", "attention_head_outputs")

#: Decode steps the generate checks take after the prompt.
DECODE_STEPS = 2


def per_head(values: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """One call's served x, C, B, betas and decays in float32, C and B repeated from their groups to the heads."""
    x = values["attention_values"].float()
    per_group = x.shape[2] // values["attention_keys"].shape[2]
    queries, keys = (
        values[name].float().repeat_interleave(per_group, dim=2) for name in ("attention_queries", "attention_keys")
    )
    return x, queries, keys, values["betas"].float(), values["decays"].float()


def ssd_reference(
    mixer: StateSpace, values: dict[str, Any], initial: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD recurrence recomputed from one call's served values: (state after every token, y).

    Per head, in the State layout ``[state_dim, head_dim]``::

        h_t = exp(decays_t) * h_{t-1} + betas_t * B_t x_t^T
        y_t = C_t^T h_t + D * x_t

    with ``B`` and ``C`` shared by the heads of a group, ``D`` the mixer's own
    skip, and ``h`` starting from ``initial`` (zeros when ``None``).
    """
    x, queries, keys, betas, decays = per_head(values)
    batch, seq, heads, head_dim = x.shape
    skip = mixer._module.D.detach().float()
    state = torch.zeros(batch, heads, keys.shape[-1], head_dim) if initial is None else initial.float()
    states, outputs = [], []
    for t in range(seq):
        write = betas[:, t, :, None, None] * keys[:, t, :, :, None] * x[:, t, :, None, :]
        state = torch.exp(decays[:, t])[..., None, None] * state + write
        states.append(state)
        outputs.append(torch.einsum("bhnp,bhn->bhp", state, queries[:, t]) + skip[:, None] * x[:, t])
    return torch.stack(states, dim=1), torch.stack(outputs, dim=1)


class SSDSuite(RecurrentMixerSuite):
    """A Mamba-2 mixer's values: the reference recurrence, the decode hand-off, and writes that reach the kernel."""

    ASSIGNABLE = ("attention_keys", "attention_values", "betas", "decays")

    def read_prompt(
        self, writes: dict[str, Any] | None = None, names: tuple[str, ...] = ARGUMENT_VALUES + RESULT_VALUES
    ) -> list[dict[str, Any]]:
        """Every mixer block's values on the prompt, each block's ``writes`` assigned before its reads.

        A write is a tensor, or a function of the mixer computing one in the
        trace; what was assigned is saved as ``written``.
        """
        blocks = self.recurrent_layers()
        saved: list[dict[str, Any]] = []
        with self.model.trace(PROMPT):
            for layer in blocks:
                mixer = self.model.layers[layer].linear_attn
                values: dict[str, Any] = {}
                for name, value in (writes or {}).items():
                    values["written"] = value(mixer).save() if callable(value) else value
                    setattr(mixer, name, values["written"])
                values.update({name: _save(getattr(mixer, name)) for name in names})
                saved.append(values)
        return saved

    def read_generation(self, layer: int, write: tuple[int, str, Any] | None = None) -> list[dict[str, Any]]:
        """One mixer's values on the prompt and each decode step, per token; ``write`` is (step, value name, tensor).

        An argument value is written before the step's reads, ``state_output``
        after it is read (the order the forward makes them).
        """
        mixer = self.model.layers[layer].linear_attn
        steps: list[dict[str, Any]] = []
        with (
            self.per_token_states(),
            self.model.generate(PROMPT, max_new_tokens=DECODE_STEPS + 1, do_sample=False) as tracer,
        ):
            for step in tracer.iter[: DECODE_STEPS + 1]:
                if write is not None and write[0] == step and write[1] in ARGUMENT_VALUES:
                    setattr(mixer, write[1], write[2])
                values = {name: _save(getattr(mixer, name)) for name in ARGUMENT_VALUES + RESULT_VALUES[:2]}
                if write is not None and write[0] == step and write[1] == "state_output":
                    mixer.state_output = write[2]
                values["attention_head_outputs"] = mixer.attention_head_outputs.save()
                steps.append(values)
        return steps

    def decays_of(self, layer: int, betas: torch.Tensor) -> torch.Tensor:
        A = -torch.exp(self.model.layers[layer].linear_attn._module.A_log.detach().float())
        return A * betas.float()

    # -- the prompt ----------------------------------------------------------------

    def test_mixer_sizes_match_served_shapes(self) -> None:
        seq = len(self.model.tokenizer(PROMPT).input_ids)
        saved = self.read_prompt(names=ARGUMENT_VALUES + ("state_output", "attention_head_outputs"))
        for layer, values in zip(self.recurrent_layers(), saved, strict=True):
            mixer = self.model.layers[layer].linear_attn
            heads, head_dim, state_dim, groups = mixer.mixer_heads, mixer.head_dim, mixer.state_dim, mixer.groups
            assert tuple(values["attention_queries"].shape) == (1, seq, groups, state_dim)
            assert tuple(values["attention_keys"].shape) == (1, seq, groups, state_dim)
            assert tuple(values["attention_values"].shape) == (1, seq, heads, head_dim)
            assert tuple(values["betas"].shape) == tuple(values["decays"].shape) == (1, seq, heads)
            assert values["decays"].dtype == torch.float32 and values["decays"].max() <= 0
            assert values["state_input"] is None, "a fresh prompt starts from no state"
            assert tuple(values["state_output"].shape) == (1, heads, state_dim, head_dim)
            assert tuple(values["attention_head_outputs"].shape) == (1, seq, heads, head_dim)

    def test_states_match_reference_recurrence(self) -> None:
        with self.per_token_states():
            saved = self.read_prompt()
        for layer, values in zip(self.recurrent_layers(), saved, strict=True):
            states, outputs = ssd_reference(self.model.layers[layer].linear_attn, values)
            close(values["decays"], self.decays_of(layer, values["betas"]), what=f"layers[{layer}] decays vs A * betas")
            close(values["states"], states, what=f"layers[{layer}] states vs the SSD recurrence")
            close(values["attention_head_outputs"], outputs, what=f"layers[{layer}] head outputs vs C^T h + D x")
            assert torch.equal(values["states"][:, -1], values["state_output"]), (
                f"layers[{layer}]: states[:, -1] != state_output"
            )

    def test_state_after_indexes_states(self) -> None:
        mixer = self.model.layers[self.recurrent_layers()[0]].linear_attn
        with self.per_token_states(), self.model.trace(PROMPT):
            states = mixer.states.save()
            last = mixer.state_after(-1).save()
        assert torch.equal(last, states[:, -1])

    def test_chunked_scan_final_state_matches_reference(self) -> None:
        for layer, values in zip(
            self.recurrent_layers(), self.read_prompt(names=ARGUMENT_VALUES + RESULT_VALUES[1:]), strict=True
        ):
            states, outputs = ssd_reference(self.model.layers[layer].linear_attn, values)
            close(
                values["state_output"],
                states[:, -1],
                what=f"layers[{layer}] chunked scan's final state vs the recurrence",
            )
            close(
                values["attention_head_outputs"],
                outputs,
                what=f"layers[{layer}] chunked scan's head outputs vs the recurrence",
            )

    def test_state_output_without_a_cache(self) -> None:
        """Run without a cache, the scan returns no final state; state_output is read inside it, the same state."""
        mixer = self.model.layers[self.recurrent_layers()[0]].linear_attn
        with self.per_token_states(), self.model.trace(PROMPT, use_cache=False):
            states = mixer.states.save()
            final = mixer.state_output.save()
        assert torch.equal(states[:, -1], final)

    def test_routed_kernels_serve_the_same_states(self) -> None:
        """Bound to the pure-torch kernels (what a process with mamba_ssm needs), the values are read one level up."""
        with self.per_token_states():
            expected = self.read_prompt(names=("states", "state_output"))
        with warnings.catch_warnings():
            # This class's model was traced before the routing and keeps its kernels, as the warning says.
            warnings.filterwarnings("ignore", message=r"route_kernels\(\.\.\., 'torch'\): .* already traced")
            route_kernels(self.model.family, "torch")
        try:
            routed = self.build_model()
            chunk_per_token(routed)
            mixers = [routed.layers[layer].linear_attn for layer in self.recurrent_layers()]
            saved: list[tuple[Any, Any]] = []
            with routed.trace(PROMPT):
                for mixer in mixers:
                    saved.append((mixer.states.save(), mixer.state_output.save()))
        finally:
            route_kernels(self.model.family, "default")
        for values, (states, final) in zip(expected, saved, strict=True):
            close(states, values["states"], what="states on the routed kernels")
            assert torch.equal(states[:, -1], final)

    def test_chunk_per_token_is_per_model_and_restored(self) -> None:
        model = self.model
        other = self.build_model()
        layer = self.recurrent_layers()[0]
        configured = model.layers[layer].linear_attn._module.chunk_size
        with model.trace(PROMPT):
            chunked = model.logits.save()
        with self.per_token_states():
            assert model.support(layer)["linear_attn.states"] is None
            assert "chunk_per_token" in other.support(layer)["linear_attn.states"], (
                "chunk_per_token reached another model"
            )
            with model.trace(PROMPT):
                per_token = model.logits.save()
        assert model.layers[layer].linear_attn._module.chunk_size == configured
        assert "chunk_size=" in model.support(layer)["linear_attn.states"]
        close(per_token, chunked, atol=1e-4, what="logits with chunk_size 1 vs the configured chunk size")

    # -- writes --------------------------------------------------------------------

    def test_assigned_betas_reach_the_kernel(self) -> None:
        with self.per_token_states():
            clean = self.read_prompt()
            # Doubled, not halved: a prompt's scan clamps betas to the mixer's time_step_limit, from below on Zamba2.
            doubled = self.read_prompt(writes={"betas": lambda mixer: mixer.betas * 2})
        for layer, before, after in zip(self.recurrent_layers(), clean, doubled, strict=True):
            close(after["betas"], after["written"], what=f"layers[{layer}] betas read back after the assignment")
            close(
                after["decays"],
                self.decays_of(layer, after["betas"]),
                what=f"layers[{layer}] decays follow the assigned betas",
            )
            states, _ = ssd_reference(self.model.layers[layer].linear_attn, after)
            close(after["states"], states, what=f"layers[{layer}] states computed with the assigned betas")
            assert not torch.allclose(after["states"], before["states"]), "doubling betas left the states unchanged"

    def test_assigned_decays_reach_the_kernel(self) -> None:
        with self.per_token_states():
            doubled = self.read_prompt(writes={"decays": lambda mixer: mixer.decays * 2})
            clean = self.read_prompt()
        for layer, before, after in zip(self.recurrent_layers(), clean, doubled, strict=True):
            close(after["decays"], after["written"], what=f"layers[{layer}] decays read back after the assignment")
            states, _ = ssd_reference(self.model.layers[layer].linear_attn, after)
            close(after["states"], states, what=f"layers[{layer}] states computed with the assigned decays")
            assert not torch.allclose(after["states"], before["states"]), "doubling decays left the states unchanged"

    def test_assigned_state_input_starts_the_prompt(self) -> None:
        torch.manual_seed(0)
        mixer = self.model.layers[self.recurrent_layers()[0]].linear_attn
        start = torch.randn(1, mixer.mixer_heads, mixer.state_dim, mixer.head_dim)
        with self.per_token_states():
            saved = self.read_prompt(writes={"state_input": start})
        for layer, values in zip(self.recurrent_layers(), saved, strict=True):
            states, outputs = ssd_reference(self.model.layers[layer].linear_attn, values, initial=start)
            close(values["state_input"], start, what=f"layers[{layer}] state_input read back after the assignment")
            close(values["states"], states, what=f"layers[{layer}] states from the assigned state_input")
            close(
                values["attention_head_outputs"],
                outputs,
                what=f"layers[{layer}] head outputs from the assigned state_input",
            )

    def test_zeroed_queries_leave_only_the_skip(self) -> None:
        """An assigned C reaches the kernel: with no query the output is D * x alone."""
        blocks = self.recurrent_layers()
        saved: list[tuple[Any, Any]] = []
        with self.model.trace(PROMPT):
            for layer in blocks:
                mixer = self.model.layers[layer].linear_attn
                mixer.attention_queries = torch.zeros_like(mixer.attention_queries)
                saved.append((mixer.attention_values.save(), mixer.attention_head_outputs.save()))
        for layer, (x, outputs) in zip(blocks, saved, strict=True):
            skip = self.model.layers[layer].linear_attn._module.D.detach().float()
            close(outputs, skip[:, None] * x.float(), what=f"layers[{layer}] head outputs with zeroed queries vs D * x")

    def test_head_outputs_edited_in_place_change_only_their_token(self) -> None:
        mixer = self.model.layers[self.recurrent_layers()[0]].linear_attn
        with self.model.trace(PROMPT):
            clean = mixer.attention_output.save()
        with self.model.trace(PROMPT):
            mixer.attention_head_outputs[:, -1] = 0
            edited = mixer.attention_output.save()
        close(edited[:, :-1], clean[:, :-1], what="mixer outputs before the edited token")
        assert not torch.allclose(edited[:, -1], clean[:, -1]), "zeroing the last token's head outputs changed nothing"

    # -- decode ----------------------------------------------------------------------

    def test_decode_continues_from_the_prompt_state(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        steps = self.read_generation(layer)
        for step in range(1, DECODE_STEPS + 1):
            values, previous = steps[step], steps[step - 1]
            assert tuple(values["attention_values"].shape) == (1, 1, mixer.mixer_heads, mixer.head_dim)
            assert tuple(values["betas"].shape) == (1, 1, mixer.mixer_heads)
            assert tuple(values["attention_queries"].shape) == (1, 1, mixer.groups, mixer.state_dim)
            assert torch.equal(values["state_input"], previous["state_output"]), (
                f"step {step} does not start from step {step - 1}'s state_output"
            )
            states, outputs = ssd_reference(mixer, values, initial=values["state_input"])
            close(values["state_output"], states[:, -1], what=f"step {step} state_output vs one step of the recurrence")
            close(values["attention_head_outputs"], outputs, what=f"step {step} head outputs vs C^T h + D x")
            assert torch.equal(values["states"][:, 0], values["state_output"])

    def test_assigned_state_output_is_what_decoding_continues_from(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        zero = torch.zeros(1, mixer.mixer_heads, mixer.state_dim, mixer.head_dim)
        steps = self.read_generation(layer, write=(0, "state_output", zero))
        assert torch.equal(steps[1]["state_input"], zero), (
            "the decode step did not start from the assigned prompt state"
        )

    def test_assigned_state_input_on_a_decode_step_reaches_the_cache(self) -> None:
        torch.manual_seed(0)
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        start = torch.randn(1, mixer.mixer_heads, mixer.state_dim, mixer.head_dim)
        steps = self.read_generation(layer, write=(1, "state_input", start))
        states, _ = ssd_reference(mixer, steps[1], initial=start)
        close(steps[1]["state_input"], start, what="decode state_input read back after the assignment")
        close(steps[1]["state_output"], states[:, -1], what="decode state_output from the assigned state_input")
        assert torch.equal(steps[2]["state_input"], steps[1]["state_output"]), (
            "the cache did not keep the step's new state"
        )

    # -- what is not there -------------------------------------------------------------

    def test_per_token_state_and_writes_are_unavailable(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.model.layers[layer].linear_attn
        assert self.model.support(layer)["linear_attn.state"] == NO_STATE_OCCURRENCES
        _raises_unavailable(lambda: mixer.state.save(), self.model, NO_STATE_OCCURRENCES)
        _raises_unavailable(lambda: mixer.states.save(), self.model, "call nnterp.chunk_per_token(model)")
        _raises_unavailable(lambda: mixer.set_state_after(0, torch.zeros(1)), self.model, NO_STATE_WRITES)


def _raises_unavailable(read: Any, model: Any, reason: str) -> None:
    try:
        with model.trace(PROMPT):
            read()
    except Unavailable as error:
        assert reason in str(error), f"raised {error!r}, expected the reason {reason!r}"
    else:
        raise AssertionError(f"read without raising Unavailable ({reason})")


def _save(value: Any) -> Any:
    return None if value is None else value.save()
