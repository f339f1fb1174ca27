"""The conformance suites of lightning attention (``LightningAttention``) and of MiniMax's weighted block.

``nnterp check minimax`` runs them with core's ``MoeSuite``; the family's test
file mixes in the same ones::

    class TestMiniMax(MiniMaxLayerSuite, LightningAttentionSuite, MoeSuite):
        family = "minimax"

Every check recomputes something from served values and compares: the state
after every token against the recurrence rerun in float64 from the served
queries, keys, values and decays; the head outputs against that rerun and
against the module's own output; a decode step against one step of the
recurrence from the prompt's ``state_output``; a state written at token t
against the outputs before and after t; and ``token_mixing`` rebuilding the
head outputs (``TokenMixingSuite``). The suite carries the trace contract's
order matrix (``TraceOrderSuite``) and the forward-change faults
(``ForwardChangeSuite``), adapted to a forward that calls no kernel.
"""

from __future__ import annotations

import contextlib
import unittest
from collections.abc import Iterator
from typing import Any

import torch

from nnterp.analysis.knockout import knock_out, knockout
from nnterp.analysis.patching import patch_state
from nnterp.order import OrderError
from nnterp.testing import PROMPT, LayerSuite, check_patch_state_joins_the_prompts, close, tiny_standardized
from nnterp.testing.forward_change import ForwardChangeSuite, _Renamed
from nnterp.testing.mixing import TokenMixingSuite
from nnterp.testing.order import TraceOrderSuite
from nnterp.testing.suites import BATCH, Suite, raises

from .block import residual_factors
from .lightning_attention import BLOCK_OUTPUT, BLOCK_STATE, LightningAttention

#: Why the forward-change faults that act on a kernel function do not apply: the forward calls none.
NO_KERNEL = "MiniMaxLightningAttention's forward calls no kernel function: its places are found by variable name"

ATOL = 1e-5
#: What the recurrence is computed from, in ``lightning_reference``'s order.
INPUTS = ("attention_queries", "attention_keys", "attention_values", "decays")


def served_inputs(values: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The served queries, keys, values and decays of one call, in ``lightning_reference``'s order."""
    return [values[name] for name in INPUTS]


def lightning_reference(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    decays: torch.Tensor,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence token by token in float64 over served values; returns (states, head outputs).

    ``queries``, ``keys`` [batch, seq, heads, key_dim], ``values`` [batch, seq, heads, value_dim], ``decays``
    [batch, seq, heads] (the log of what the state keeps); ``state`` where it starts (zeros when ``None``)::

        S_t = exp(decays_t) S_{t-1} + k_t^T v_t
        o_t = q_t S_t
    """
    q, k, v, d = (x.double() for x in (queries, keys, values, decays))
    batch, seq, heads, key_dim = k.shape
    S = k.new_zeros(batch, heads, key_dim, v.shape[-1]) if state is None else state.double()
    states, outputs = [], []
    for t in range(seq):
        S = torch.exp(d[:, t])[..., None, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        states.append(S)
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(states, 1), torch.stack(outputs, 1)


class MiniMaxLayerSuite(LayerSuite):
    """MiniMax's block weights its normed stream: the weighted identities replace ``layer_input + contributions``."""

    def read_block(self, layer: int) -> dict[str, torch.Tensor]:
        """The block's streams and contributions, saved, in the forward's order."""
        block = self.model.layers[layer]
        mixer = getattr(block, "linear_attn", None) or block.self_attn
        return {
            "layer_input": block.layer_input.save(),
            "attention_norm_output": block.attention_norm_output.save(),
            "attention_output": mixer.attention_output.save(),
            "layer_mid": block.layer_mid.save(),
            "mlp_norm_output": block.mlp_norm_output.save(),
            "mlp_output": block.mlp.mlp_output.save(),
            "layer_output": block.layer_output.save(),
        }

    def test_contributions_add_up_to_layer_output(self) -> None:
        """``layer_output == alpha_mlp * mlp_norm_output + beta_mlp * mlp_output``; the plain sum does not hold."""
        saved = []
        with self.model.trace(PROMPT):
            for layer in range(self.model.num_layers):
                saved.append(self.read_block(layer))
        for layer, read in enumerate(saved):
            _, _, alpha, beta = residual_factors(self.model.layers[layer])
            close(alpha * read["mlp_norm_output"] + beta * read["mlp_output"], read["layer_output"], what=f"{layer}")
            plain = read["layer_input"] + read["attention_output"] + read["mlp_output"]
            assert (plain - read["layer_output"]).abs().max() > 1e-3, f"layers[{layer}]: the plain identity holds"

    def test_layer_mid_is_input_plus_the_sequence_mixers(self) -> None:
        """``layer_mid == alpha_attn * attention_norm_output + beta_attn * attention_output``, on either mixer."""
        saved = []
        with self.model.trace(PROMPT):
            for layer in range(self.model.num_layers):
                saved.append(self.read_block(layer))
        for layer, read in enumerate(saved):
            alpha, beta, _, _ = residual_factors(self.model.layers[layer])
            mixed = alpha * read["attention_norm_output"] + beta * read["attention_output"]
            close(mixed, read["layer_mid"], what=f"layers[{layer}]: layer_mid")

    def test_assigned_layer_mid_reaches_the_mlp_and_the_residual_it_is_added_to(self) -> None:
        """A written ``layer_mid`` is what the MLP's norm reads: ``layer_output`` follows from it by the weighting."""
        block = self.model.layers[0]
        saved: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            written = (torch.randn_like(block.layer_mid) * block.layer_mid.std()).save()
            block.layer_mid = written
            saved.extend((block.mlp_norm_output.save(), block.mlp.mlp_output.save(), block.layer_output.save()))
        normed, mlp, leaving = saved
        with torch.no_grad():
            expected = block._module.post_attention_layernorm(written)
        close(normed, expected, what="layers[0].mlp_norm_output after assigning layer_mid")
        _, _, alpha, beta = residual_factors(block)
        close(alpha * normed + beta * mlp, leaving, what="layers[0].layer_output after assigning layer_mid")


class LightningAttentionSuite(TokenMixingSuite, TraceOrderSuite, ForwardChangeSuite, Suite):
    """A lightning-attention mixer's values agree with the recurrence they come from, on prompts and decode steps."""

    def recurrent_layers(self) -> list[int]:
        layers = [
            i
            for i, layer in enumerate(self.model.layers)
            if isinstance(getattr(layer, "linear_attn", None), LightningAttention)
        ]
        assert layers, f"{self.family}: no block has lightning attention"
        return layers

    def mixer(self, layer: int) -> Any:
        return self.model.layers[layer].linear_attn

    def order_layer(self) -> int:
        return self.recurrent_layers()[0]

    @contextlib.contextmanager
    def per_token_states(self) -> Iterator[None]:
        """``states`` are computed from every call's arguments: nothing to switch on."""
        yield

    # -- a changed forward: its places are variable names, not a kernel's ----------------------------------

    def test_renamed_kernel_is_named(self) -> None:
        raise unittest.SkipTest(NO_KERNEL)

    def test_prompt_kernel_called_twice_is_named(self) -> None:
        raise unittest.SkipTest(NO_KERNEL)

    def test_reordered_parameters_serve_the_same_values(self) -> None:
        raise unittest.SkipTest(NO_KERNEL)

    def test_renamed_state_binding_is_named(self) -> None:
        """The state the block loop hands on, renamed in the forward: the values name the binding they expected."""
        name = BLOCK_STATE.name
        with self.changed(_Renamed(name, f"{name}_v2", scope="forward"), "renamed_state") as model:
            self._assert_named(model, name)

    def test_renamed_block_output_binding_is_named(self) -> None:
        """A block's outputs, renamed in the forward: the values name the binding they expected."""
        name = BLOCK_OUTPUT.name
        with self.changed(_Renamed(name, f"{name}_v2", scope="forward"), "renamed_output") as model:
            self._assert_named(model, name)

    def read_call(self, mixer: Any) -> dict[str, torch.Tensor]:
        """Every value of one call, saved, in the forward's order."""
        read = {}
        for name in (*INPUTS, "states"):
            read[name] = getattr(mixer, name).save()
        read["attention_head_outputs"] = mixer.attention_head_outputs.save()
        read["output_gates"] = mixer.output_gates.save()
        read["state_output"] = mixer.state_output.save()
        read["attention_output"] = mixer.attention_output.save()
        return read

    def test_states_and_head_outputs_are_the_recurrence(self) -> None:
        read: dict[int, dict[str, torch.Tensor]] = {}
        with self.model.trace(PROMPT):
            for layer in self.recurrent_layers():
                read[layer] = self.read_call(self.mixer(layer))
        for layer, values in read.items():
            states, outputs = lightning_reference(*served_inputs(values))
            seq, block = states.shape[1], self.mixer(layer)._module.block_size
            assert seq > block, f"the prompt ({seq} tokens) must cross a block of {block}"
            scale = states.abs().max().item()
            close(values["states"], states, ATOL * scale, f"layers[{layer}] states vs the float64 recurrence")
            close(values["attention_head_outputs"], outputs, ATOL, f"layers[{layer}] head outputs vs the recurrence")
            close(values["states"][:, -1], values["state_output"], ATOL * scale, "states[:, -1] vs state_output")

    def test_head_outputs_through_the_modules_tail_are_its_output(self) -> None:
        """norm, gate and out_proj applied to the served head outputs give the module's own output."""
        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        read: list[dict[str, torch.Tensor]] = []
        with self.model.trace(PROMPT):
            read.append(self.read_call(mixer))
        values, module = read[0], mixer._module
        with torch.no_grad():
            rebuilt = module.out_proj(
                values["output_gates"].flatten(-2) * module.norm(values["attention_head_outputs"].flatten(-2))
            )
        close(rebuilt, values["attention_output"], ATOL, "out_proj(gate * norm(head outputs)) vs attention_output")

    def test_a_left_padded_batch_follows_the_recurrence(self) -> None:
        tokenizer = self.model.tokenizer
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        read: list[dict[str, torch.Tensor]] = []
        try:
            with self.model.trace(list(BATCH)):
                read.append(self.read_call(self.mixer(self.recurrent_layers()[0])))
        finally:
            tokenizer.padding_side = side
        values = read[0]
        states, outputs = lightning_reference(*served_inputs(values))
        close(values["states"], states, ATOL * states.abs().max().item(), "padded batch states")
        close(values["attention_head_outputs"], outputs, ATOL, "padded batch head outputs")

    def test_decode_steps_continue_the_state_output(self) -> None:
        steps = 3
        mixer = self.mixer(self.recurrent_layers()[0])
        read = []
        with self.model.generate(PROMPT, max_new_tokens=steps, min_new_tokens=steps, do_sample=False) as tracer:
            for _ in tracer.iter[:steps]:
                entering = mixer.state_input.save()
                values = self.read_call(mixer)
                values["state_input"] = entering
                read.append(values)
        assert len(read) == steps and read[0]["state_input"] is None
        for step in range(1, steps):
            values = read[step]
            close(values["state_input"], read[step - 1]["state_output"], 0, f"step {step}: state_input")
            states, outputs = lightning_reference(*served_inputs(values), values["state_input"])
            assert values["states"].shape[1] == 1
            close(values["states"], states, ATOL * states.abs().max().item(), f"step {step}: states")
            close(values["state_output"], states[:, -1], ATOL * states.abs().max().item(), f"step {step}: output")
            close(values["attention_head_outputs"], outputs, ATOL, f"step {step}: head outputs")

    def written_run(self, layer: int, t: int, value: torch.Tensor | None) -> dict[str, torch.Tensor]:
        mixer = self.mixer(layer)
        read: dict[str, torch.Tensor] = {}
        with self.model.trace(PROMPT):
            for name in INPUTS:
                read[name] = getattr(mixer, name).save()
            if value is not None:
                mixer.set_state_after(t, value)
            read["attention_head_outputs"] = mixer.attention_head_outputs.save()
            read["state_output"] = mixer.state_output.save()
            read["logits"] = self.model.logits.save()
        return read

    def test_a_written_state_is_continued_by_later_tokens_only(self) -> None:
        layer = self.recurrent_layers()[0]
        block = self.mixer(layer)._module.block_size
        for t in (block + 1, 2 * block - 1, 0):  # inside a block, at its end, at the first token
            clean = self.written_run(layer, t, None)
            written = torch.randn_like(clean["state_output"]) * 3
            run = self.written_run(layer, t, written)
            outputs = run["attention_head_outputs"]
            if t:
                close(outputs[:, :t], clean["attention_head_outputs"][:, :t], 0, f"t={t}: outputs before the write")
            # from the written state on, the recurrence continues: token t reads it, later tokens decay it
            q, k, v, d = served_inputs(run)
            rest, expected = lightning_reference(q[:, t + 1 :], k[:, t + 1 :], v[:, t + 1 :], d[:, t + 1 :], written)
            here = torch.einsum("bhk,bhkv->bhv", q[:, t].double(), written.double())
            close(outputs[:, t], here, ATOL * 10, f"t={t}: token {t} reads the written state")
            close(outputs[:, t + 1 :], expected, ATOL * 10, f"t={t}: later outputs continue the written state")
            close(run["state_output"], rest[:, -1], ATOL * rest.abs().max().item(), f"t={t}: state_output")
            assert not torch.allclose(run["logits"][:, -1], clean["logits"][:, -1]), f"t={t}: logits unchanged"

    def test_a_written_state_output_is_the_next_steps_state_input(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        read = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for step in tracer.iter[:2]:
                if step == 0:
                    written = torch.ones_like(mixer.state_output) * 0.25
                    mixer.state_output = written
                    read.append(written.save())
                else:
                    read.append(mixer.state_input.save())
        close(read[1], read[0], 0, "the next step starts from the written state_output")

    def test_state_input_written_on_a_decode_step_is_continued(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        read = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for step in tracer.iter[:2]:
                if step == 1:
                    written = torch.full_like(mixer.state_input, 0.5)
                    mixer.state_input = written
                    values = {}
                    for name in INPUTS:
                        values[name] = getattr(mixer, name).save()
                    values["attention_head_outputs"] = mixer.attention_head_outputs.save()
                    read.append((written, values))
        written, values = read[0]
        _, outputs = lightning_reference(*served_inputs(values), written)
        close(values["attention_head_outputs"], outputs, ATOL, "a decode step from the written state_input")

    def test_wrong_writes_and_late_writes_are_refused(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        with raises(ValueError, "state_input"):
            with self.model.trace(PROMPT):
                mixer.state_input = torch.zeros(1, mixer.mixer_heads, mixer.key_dim, mixer.value_dim)
        with raises(ValueError, r"set_state_after\(2\)"):
            with self.model.trace(PROMPT):
                mixer.set_state_after(2, torch.zeros(1, 3))
        with raises(OrderError, r"set_state_after\(2\)"):
            with self.model.trace(PROMPT):
                mixer.attention_head_outputs.save()
                mixer.set_state_after(2, torch.zeros(1, mixer.mixer_heads, mixer.key_dim, mixer.value_dim))
        block = mixer._module.block_size
        with raises(OrderError, "increasing blocks"):
            with self.model.trace(PROMPT):
                zero = torch.zeros(1, mixer.mixer_heads, mixer.key_dim, mixer.value_dim)
                mixer.set_state_after(block + 1, zero)
                mixer.set_state_after(1, zero)

    # -- analysis: knockout and state patching ------------------------------------------------------

    def test_knock_out_removes_one_tokens_write(self) -> None:
        """A knocked token's key is zero: earlier outputs are untouched, later ones are the recurrence without it."""
        layer, t = self.recurrent_layers()[0], 5
        mixer = self.mixer(layer)
        clean: dict[str, torch.Tensor] = {}
        knocked: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            for name in INPUTS:
                clean[name] = getattr(mixer, name).save()
            clean["attention_head_outputs"] = mixer.attention_head_outputs.save()
        with self.model.trace(PROMPT):
            knock_out(self.model, [t], layers=[layer])
            knocked.append(mixer.attention_head_outputs.save())
        outputs, before = knocked[0], clean["attention_head_outputs"]
        close(outputs[:, :t], before[:, :t], 0, "outputs before the knocked token")
        changed = (outputs[:, t:] - before[:, t:]).abs().amax(dim=(0, 2, 3))
        assert (changed > 1e-6).all(), f"outputs from the knocked token on, unchanged at some: {changed}"
        q, k, v, d = served_inputs(clean)
        k = k.clone()
        k[:, t] = 0
        _, expected = lightning_reference(q, k, v, d)
        close(outputs, expected, ATOL, "knocked outputs vs the float64 recurrence with the token's key zeroed")
        changes = knockout(self.model, PROMPT, [t], layers=[layer], metric=lambda logits: logits[:, : t + 1].float())
        close(changes[:, :t], torch.zeros_like(changes[:, :t]), 0, "knockout: the logits before the token")
        assert changes[:, t].abs().max() > 1e-6, "knockout left the knocked token's own logits unchanged"

    def test_patch_state_over_a_cache_that_miscounts_continues_a_token_at_a_time(self) -> None:
        """With a softmax block after a lightning block 0, MiniMax's cache counts no tokens; continued one token at a
        time, each told its position, ``patch_state`` in every block gives, after t, the logits of the source's tokens
        up to t followed by the target's (the lightning state and the softmax keys and values carried)."""
        model = tiny_standardized(self.family, layer_types=["linear_attention", "full_attention"], num_hidden_layers=2)
        check_patch_state_joins_the_prompts(model)

    def test_patch_state_continues_from_the_source_state(self) -> None:
        """``patch_state`` at t gives the logits of the target whose state after t is the source's (``set_state_after``).

        On a model of lightning blocks only: MiniMax's cache reports its length from block 0, so a softmax block
        continued over a cache without explicit positions (as ``patch_state`` continues) gets a mask too short.
        """
        model = tiny_standardized(self.family, layer_types=["linear_attention"] * 2, num_hidden_layers=2)
        mixer, t, source = model.layers[0].linear_attn, 5, "Hi you there, friend of mine"
        saved: list[torch.Tensor] = []
        with model.trace(source):
            saved.append(mixer.state_after(t).save())
        with model.trace(PROMPT):
            saved.append(model.logits.save())
        with model.trace(PROMPT):
            mixer.set_state_after(t, saved[0])
            saved.append(model.logits.save())
        _, clean, written = saved
        changes = patch_state(model, source, PROMPT, [t], layers=[0], metric=lambda logits: logits.float())
        close(changes[:, :t], torch.zeros_like(changes[:, :t]), ATOL, "patch_state: the logits before t")
        close(clean + changes, written, ATOL * 10, "patch_state vs the target with the source's state after t")
        assert (written - clean)[:, t:].abs().amax(dim=-1).min() > 1e-6, "the patched state changed no later logit"
