"""The conformance suites of an RWKV-4 model: its blocks (``RwkvLayerSuite``) and its WKV mixers (``WkvSuite``).

A family's test file mixes them in::

    class TestRwkv(RwkvLayerSuite, WkvSuite, ForwardChangeSuite):
        family = "rwkv"

Every check recomputes something from served values and compares: the states
and outputs against the RWKV-4 paper's recurrence in real (unstabilized)
float64 arithmetic, the mixer's contribution against transformers' own forward,
a decode step against one step of the recurrence from the state the prompt
left, a state written after token t against the outputs up to t and after it.
"""

from __future__ import annotations

import unittest
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import torch
from transformers.integrations import use_kernel_func_from_hub_with_fallback

from nnterp.availability import Unavailable
from nnterp.components.declaration import modeling_module
from nnterp.forward_source import callee
from nnterp.order import OrderError
from nnterp.registry import REGISTRY
from nnterp.testing import (
    PROMPT,
    LayerSuite,
    RecurrentMixerSuite,
    check_patch_state_joins_the_prompts,
    close,
    close_relative,
)
from nnterp.testing.forward_change import _Renamed
from nnterp.testing.models import tiny_standardized

ATOL = 1e-5
#: Two prompts of one length: RWKV reads every token it is given (it has no attention mask), so a padded prompt is
#: another input, and the two-invokes check compares prompts that need no padding.
SAME_LENGTH = ("Hello world, there", "Hi you, my friends")


def paper_wkv(
    decays: torch.Tensor,
    bonus: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    entering: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RWKV-4's WKV in real arithmetic, float64: (outputs, real numerators, real denominators) after every token.

    ``decays`` is the log decay per token ``-w`` and ``bonus`` ``u`` ([channels]);
    ``keys`` and ``values`` [batch, seq, channels]; ``entering`` the kernel's
    (num, den, max) state [batch, channels, 3] the call starts from, or ``None``
    for nothing. Per channel::

        wkv_t = (a_{t-1} + e^{u + k_t} v_t) / (b_{t-1} + e^{u + k_t})
        a_t = e^{-w} a_{t-1} + e^{k_t} v_t        b_t = e^{-w} b_{t-1} + e^{k_t}

    which unrolls to the paper's ``sum_{i<t} e^{-(t-1-i)w + k_i} v_i`` sums.
    """
    decay, u = decays.double().exp(), bonus.double()
    k, v = keys.double(), values.double()
    if entering is None:
        a = b = torch.zeros_like(k[:, 0])
    else:
        scale = entering[..., 2].double().exp()
        a, b = entering[..., 0].double() * scale, entering[..., 1].double() * scale
    outputs, numerators, denominators = [], [], []
    for t in range(k.shape[1]):
        own = torch.exp(u + k[:, t])
        outputs.append((a + own * v[:, t]) / (b + own))
        a = decay * a + torch.exp(k[:, t]) * v[:, t]
        b = decay * b + torch.exp(k[:, t])
        numerators.append(a)
        denominators.append(b)
    return torch.stack(outputs, 1), torch.stack(numerators, 1), torch.stack(denominators, 1)


def real_sums(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's stabilized (num, den, max) as the real numerator and denominator, float64."""
    scale = states[..., 2].double().exp()
    return states[..., 0].double() * scale, states[..., 1].double() * scale


class RwkvLayerSuite(LayerSuite):
    """``LayerSuite`` on RWKV blocks, where block 0's stream starts inside it and the model halves it after some.

    The layer suite's checks of a skipped block and of a value read out of
    order run on block 1: block 0's ``layer_input`` is its ``pre_ln``'s
    output, inside the block, so the block has begun once it is read.
    """

    def test_first_block_stream_starts_at_pre_ln(self) -> None:
        model = self.model
        with model.trace(PROMPT):
            embeddings = model.embed_tokens.output.save()
            entering = model.layers[0].layer_input.save()
        with torch.no_grad():
            normed = model.layers[0]._module.pre_ln(embeddings)
        close(entering, normed, ATOL, "layers[0].layer_input vs pre_ln(embeddings)")
        assert not torch.allclose(entering, embeddings), "block 0's stream is the embeddings, not pre_ln's output"

    def test_stream_halves_after_every_rescale_every_th_block(self) -> None:
        model = self.model
        halving = [i for i in range(model.num_layers - 1) if model.layers[i].halves_after]
        assert halving, "the tiny config halves after no block: set rescale_every below num_hidden_layers"
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        with model.trace(PROMPT):
            pairs.extend((model.layers[i].layer_output.save(), model.layers[i + 1].layer_input.save()) for i in halving)
        for i, (leaving, entering) in zip(halving, pairs, strict=True):
            close(entering, leaving / 2, ATOL, f"layers[{i + 1}].layer_input vs layers[{i}].layer_output / 2")

    def test_skipped_block_passes_its_input_on(self) -> None:
        model = self.model
        block = 1
        with model.trace(PROMPT):
            entering = model.layers[block].layer_input.save()
            model.layers[block].skip(entering)
            received = model.layers[block + 1].layer_input.save()
        halved = 2 if model.layers[block].halves_after else 1
        close(received, entering / halved, what=f"layers[{block + 1}].layer_input after skipping layers[{block}]")

    def test_a_value_asked_for_after_the_forward_produced_it_raises_at_once(self) -> None:
        model = self.model
        for decode in (False, True):
            try:
                if decode:
                    with model.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
                        for _ in tracer.iter[1:3]:
                            model.layers[1].layer_output.save()
                            model.layers[1].layer_input.save()
                else:
                    with model.trace(PROMPT):
                        model.layers[1].layer_output.save()
                        model.layers[1].layer_input.save()
            except OrderError as error:
                assert "layer_input on layers[1]" in str(error), str(error)
            else:
                raise AssertionError("layer_input after layer_output was served")


class WkvSuite(RecurrentMixerSuite):
    """An RWKV-4 WKV mixer's values agree with the paper's recurrence, transformers' forward and the cache."""

    ASSIGNABLE: ClassVar[tuple[str, ...]] = ("attention_keys", "attention_values")
    #: Where a write must show tokens later, the decay per token is set this mild: exp(-exp(-2)) keeps 87%.
    MILD = -2.0

    @contextmanager
    def mild_decays(self) -> Iterator[None]:
        """Every mixer's ``time_decay`` set to ``MILD`` (random ones forget within a token on some channels), then back."""
        modules = [self.mixer(layer)._module for layer in self.recurrent_layers()]
        saved = [module.time_decay.detach().clone() for module in modules]
        with torch.no_grad():
            for module in modules:
                module.time_decay.fill_(self.MILD)
        try:
            yield
        finally:
            with torch.no_grad():
                for module, original in zip(modules, saved, strict=True):
                    module.time_decay.copy_(original)

    def read_prompt(self, layer: int) -> dict[str, torch.Tensor]:
        mixer = self.mixer(layer)
        saved: dict[str, torch.Tensor] = {}
        with self.model.trace(PROMPT):
            saved["gates"] = mixer.attention_gates.save()
            saved["keys"] = mixer.attention_keys.save()
            saved["values"] = mixer.attention_values.save()
            saved["decays"] = mixer.decays.save()
            saved["bonus"] = mixer.bonus.save()
            saved["state_input"] = mixer.state_input.save()
            saved["states"] = mixer.states.save()
            saved["outputs"] = mixer.attention_head_outputs.save()
            saved["state_output"] = mixer.state_output.save()
            saved["attention_output"] = mixer.attention_output.save()
        return saved

    # -- a prompt ---------------------------------------------------------------------

    def test_states_and_outputs_follow_the_papers_recurrence(self) -> None:
        for layer in self.recurrent_layers():
            values = self.read_prompt(layer)
            outputs, numerators, denominators = paper_wkv(
                values["decays"], values["bonus"], values["keys"], values["values"], values["state_input"]
            )
            num, den = real_sums(values["states"])
            close_relative(num, numerators, f"layers[{layer}] real numerators vs the paper's")
            close_relative(den, denominators, f"layers[{layer}] real denominators vs the paper's")
            close_relative(values["outputs"], outputs, f"layers[{layer}] attention_head_outputs vs the paper's wkv")
            assert torch.equal(values["states"][:, -1], values["state_output"]), "states[:, -1] != state_output"

    def test_a_prompt_with_a_cache_starts_from_the_empty_state(self) -> None:
        values = self.read_prompt(self.recurrent_layers()[0])
        start = values["state_input"]
        assert torch.equal(start[..., :2], torch.zeros_like(start[..., :2])) and (start[..., 2] <= -1e29).all()

    def test_mixer_output_is_transformers_own(self) -> None:
        """``output(gates * head_outputs)`` is the contribution, which is what transformers' forward computes."""
        module = self.model._module
        own: list[torch.Tensor] = []
        hooks = [
            self.mixer(layer)._module.register_forward_hook(lambda _m, _i, out: own.append(out[0].detach()))
            for layer in self.recurrent_layers()
        ]
        try:
            with torch.no_grad():
                module(**self.model.tokenizer(PROMPT, return_tensors="pt"))
        finally:
            for hook in hooks:
                hook.remove()
        for layer, expected in zip(self.recurrent_layers(), own, strict=True):
            values = self.read_prompt(layer)
            projection = self.mixer(layer)._module.output
            with torch.no_grad():
                rebuilt = projection(values["gates"] * values["outputs"])
            close(values["attention_output"], expected, ATOL, f"layers[{layer}] attention_output vs the plain forward")
            close(rebuilt, expected, ATOL, f"layers[{layer}] output(attention_gates * attention_head_outputs)")
            assert ((values["gates"] > 0) & (values["gates"] < 1)).all(), "the receptance is not a sigmoid"

    def test_zero_gates_silence_the_mixer(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        with self.model.trace(PROMPT):
            mixer.attention_gates = torch.zeros_like(mixer.attention_gates)
            added = mixer.attention_output.save()
        assert torch.count_nonzero(added) == 0, "zero receptance left a contribution"

    def test_decays_and_bonus_are_the_parameters(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        values = self.read_prompt(self.recurrent_layers()[0])
        assert torch.equal(values["decays"], -torch.exp(mixer._module.time_decay.detach()))
        assert torch.equal(values["bonus"], mixer._module.time_first.detach())

    def test_state_after_token_is_that_tokens_state(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        values = self.read_prompt(layer)
        seq = values["states"].shape[1]
        for t in (0, seq // 2, seq - 1):
            with self.model.trace(PROMPT):
                state = mixer.state_after(t).save()
            assert torch.equal(state, values["states"][:, t]), f"state_after({t}) != states[:, {t}]"

    def test_state_is_refused_with_the_reason(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        reason = self.model.support(layer=self.recurrent_layers()[0])["linear_attn.state"]
        assert reason is not None and "state_after" in reason
        try:
            with self.model.trace(PROMPT):
                mixer.state.save()
        except Unavailable as error:
            assert "num_state, den_state, max_state" in str(error)
        else:
            raise AssertionError("state was served")

    # -- writes -------------------------------------------------------------------------

    def test_state_write_changes_later_tokens_and_not_earlier_ones(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        with self.mild_decays():
            clean = self.read_prompt(layer)
            seq = clean["states"].shape[1]
            token = seq // 2
            # the state a prompt starts from: nothing written
            empty = clean["state_input"]
            with self.model.trace(PROMPT):
                mixer.set_state_after(token, empty)
                outputs = mixer.attention_head_outputs.save()
        close(outputs[:, : token + 1], clean["outputs"][:, : token + 1], ATOL, "outputs up to the written token")
        for t in (token + 1, seq - 1):
            assert not torch.allclose(outputs[:, t], clean["outputs"][:, t]), f"the output at {t} did not change"
        # from the empty state, token + 1 reads only itself: its output is its own value
        close(outputs[:, token + 1], clean["values"][:, token + 1], ATOL, "the first output after an emptied state")

    def test_a_write_of_the_wrong_shape_is_refused(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        try:
            with self.model.trace(PROMPT):
                mixer.set_state_after(1, torch.zeros(1, mixer.channels))
        except ValueError as error:
            assert "set_state_after" in str(error) or "states" in str(error), str(error)
            assert "nothing was written" in str(error), str(error)
        else:
            raise AssertionError("a state of the wrong shape was written")

    # -- decoding -----------------------------------------------------------------------

    def test_decode_step_continues_from_the_prompts_state(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        prompt: list[torch.Tensor] = []
        step: dict[str, torch.Tensor] = {}
        with self.model.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
            for _ in tracer.iter[0]:
                prompt.append(mixer.state_output.save())
            for _ in tracer.iter[1]:
                step["entering"] = mixer.state_input.save()
                step["keys"] = mixer.attention_keys.save()
                step["values"] = mixer.attention_values.save()
                step["decays"] = mixer.decays.save()
                step["bonus"] = mixer.bonus.save()
                step["states"] = mixer.states.save()
                step["outputs"] = mixer.attention_head_outputs.save()
                step["leaving"] = mixer.state_output.save()
        assert torch.equal(step["entering"], prompt[0]), "step 1's state_input != the prompt's state_output"
        outputs, numerators, denominators = paper_wkv(
            step["decays"], step["bonus"], step["keys"], step["values"], step["entering"]
        )
        close_relative(step["outputs"], outputs, "a decode step's output vs the paper's, from the prompt's state")
        num, den = real_sums(step["leaving"])
        close_relative(num, numerators[:, 0], "a decode step's real numerator")
        close_relative(den, denominators[:, 0], "a decode step's real denominator")
        assert step["states"].shape[1] == 1 and torch.equal(step["states"][:, 0], step["leaving"])

    def test_state_input_write_on_a_decode_step_reaches_it(self) -> None:
        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        read: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1]:
                empty = mixer.state_input.clone()
                empty[..., :2] = 0
                empty[..., 2] = -1e30
                mixer.state_input = empty
                read.extend((mixer.attention_values.save(), mixer.attention_head_outputs.save()))
        close(read[1], read[0], ATOL, "from an empty state a decode step's output is its own value")

    def test_shift_state_input_is_the_previous_tokens_norm_output(self) -> None:
        """A decode step's token shift starts from the prompt's last ``ln1`` output; a prompt's from zeros."""
        layer = self.recurrent_layers()[0]
        block, mixer = self.model.layers[layer], self.mixer(layer)
        read: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[0]:
                read.append(block.attention_norm_output.save())
                read.append(mixer.shift_state_input.save())
            for _ in tracer.iter[1]:
                read.append(block.attention_norm_output.save())
                read.append(mixer.shift_state_input.save())
                read.append(mixer.attention_keys.save())
        normed, fresh, own, entering, keys = read
        assert torch.equal(fresh, torch.zeros_like(fresh)), "a fresh prompt's token shift does not start from zeros"
        assert torch.equal(entering, normed[:, -1]), "a decode step's token shift is not the prompt's last ln1 output"
        # the decode step's key mixes its own input with the shifted one: rebuilt from the served shift state
        module = mixer._module
        mix = module.time_mix_key
        with torch.no_grad():
            rebuilt = module.key(own * mix + entering[:, None] * (1 - mix))
        close(keys, rebuilt, ATOL, "a decode step's key from its input and shift_state_input")

    # -- the recurrent suite, where RWKV differs -------------------------------------------

    def test_read_state_of_the_state_after_a_token_is_its_head_output(self) -> None:
        """RWKV's output at t reads the state after t - 1 (and its own value): ``read_state(states[:, t-1], t)``."""
        mixer = self.mixer(self.recurrent_layers()[0])
        read: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            start = mixer.state_input.save()
            states = mixer.state_trajectory.save()
            read.append(mixer.attention_head_outputs.save())
            read.append(mixer.read_state(start, positions=0).save())
            read.extend(mixer.read_state(states[:, t - 1], positions=t).save() for t in range(1, states.shape[1]))
        outputs, answers = read[0], torch.stack(read[1:], dim=1)
        torch.testing.assert_close(answers, outputs.float(), rtol=1e-4, atol=1e-5)
        with self.model.trace(PROMPT):
            keys = mixer.attention_keys.save()
            read.append(mixer.read_state(torch.zeros_like(start), positions=-1).save())
        assert (read[-1] - answers[:, -1]).abs().max() > 0, "read_state answered without reading the state"
        assert keys.shape[1] == outputs.shape[1]

    def test_two_invokes_of_a_padded_batch_keep_their_own_order(self) -> None:
        """Two invokes, one reading in the taught order and one reversed: each gets its own prompt's values."""
        mixer = self.mixer(self.order_layer())
        alone: list[list[torch.Tensor]] = []
        together: list[list[torch.Tensor]] = [[], []]
        for prompt in SAME_LENGTH:
            with self.model.trace(prompt):
                alone.append([mixer.states.save(), mixer.attention_head_outputs.save()])
        with self.model.trace() as tracer:
            with tracer.invoke(SAME_LENGTH[0]):
                together[0].extend((mixer.states.save(), mixer.attention_head_outputs.save()))
            with tracer.invoke(SAME_LENGTH[1]):
                heads = mixer.attention_head_outputs.save()
                together[1].extend((mixer.state_trajectory.save(), heads))
        for index, (got, want) in enumerate(zip(together, alone, strict=True)):
            assert len(got) == 2, f"invoke {index}: the trace ended early"
            for value, expected in zip(got, want, strict=True):
                close_relative(value, expected, f"invoke {index}: a value vs its own trace's")

    def test_state_trajectory_of_a_call_continuing_a_cache(self) -> None:
        """Several tokens after a cached prompt, the model's ``state`` list passed back in."""
        ids = self.model.tokenizer(PROMPT, return_tensors="pt").input_ids
        split = ids.shape[1] // 2
        read: list[torch.Tensor] = []
        prompt = self.model._module(ids[:, :split], use_cache=True)
        with self.model.trace(ids[:, split:], use_cache=True, state=prompt.state):
            for layer in self.recurrent_layers():
                mixer = self.mixer(layer)
                read.append(mixer.states.save())
                mixer.output.save()
                read.append(mixer.state_trajectory.save())
        for layer, states, trajectory in zip(self.recurrent_layers(), read[::2], read[1::2], strict=True):
            close_relative(trajectory, states, f"layers[{layer}] state_trajectory of a call continuing a cache")

    def test_state_trajectory_follows_assignments_made_after_other_reads(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        untouched: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            untouched.append(mixer.state_trajectory.save())
        for name in self.ASSIGNABLE:
            read: list[torch.Tensor] = []
            with self.model.trace(PROMPT):
                mixer.bonus.save()
                setattr(mixer, name, getattr(mixer, name) * 0.5)
                read.extend((mixer.state_trajectory.save(), mixer.states.save()))
            trajectory, states = read
            close_relative(trajectory, states, f"state_trajectory vs states after assigning {name}")
            assert not torch.allclose(trajectory, untouched[0]), f"assigning {name} left the states as they were"

    def test_state_trajectory_starts_from_an_assigned_state_input(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        start = torch.randn(1, mixer.channels, 3, generator=torch.Generator().manual_seed(0))
        read: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1]:
                mixer.state_input = start
                read.extend((mixer.state_output.save(), mixer.state_trajectory.save()))
        close_relative(read[1][:, 0], read[0], "a decode step's trajectory after a state_input assignment")
        read.clear()
        with self.model.trace(PROMPT):
            mixer.state_input = start
            read.extend((mixer.state_trajectory.save(), mixer.states.save()))
        close_relative(read[0], read[1], "a prompt's trajectory vs states after a state_input assignment")

    def test_an_optimized_kernel_leaves_only_the_trajectory(self) -> None:
        """With the forward's ``rwkv_linear_attention`` dispatched to an optimized kernel, only the loop's states go."""
        layer = self.recurrent_layers()[0]
        mixer_class = type(self.mixer(layer))
        module_class = next(key for key, value in REGISTRY.family(self.family).ENVOYS.items() if value is mixer_class)
        modeling, name = modeling_module(module_class), mixer_class.PROMPT.function
        with self.default_kernels():
            imported = getattr(modeling, name)
            try:
                setattr(
                    modeling,
                    name,
                    use_kernel_func_from_hub_with_fallback("dumps", "json")(callee(imported).torch_function),
                )
                support = self.build_model().support(layer=layer)
            finally:
                setattr(modeling, name, imported)
        for value in ("attention_keys", "state_output", "states"):
            reason = support[f"linear_attn.{value}"]
            assert reason is not None and "optimized kernel (json)" in reason, f"{value}: {reason!r}"
        assert support["linear_attn.state_trajectory"] is None, support["linear_attn.state_trajectory"]

    def test_the_trajectory_follows_a_bfloat16_kernel(self) -> None:
        """A bf16 model's kernel keeps its state in float32: so do ``states`` and the trajectory."""
        model = tiny_standardized(self.family, dtype=torch.bfloat16, **self.load)
        mixer = model.layers[self.recurrent_layers()[0]].linear_attn
        read: list[torch.Tensor] = []
        with model.trace(PROMPT):
            read.extend((mixer.state_trajectory.save(), mixer.states.save()))
        assert read[0].dtype == read[1].dtype == torch.float32
        close_relative(read[0], read[1], "a bf16 model's trajectory vs its states", 1e-4)

    def test_renamed_state_binding_is_named(self) -> None:
        """The state the token loop binds, renamed inside the loop routing binds the kernel's name to."""
        if not hasattr(self, "changed"):
            raise unittest.SkipTest("mixed in without ForwardChangeSuite")
        mixer = self.mixers()[0][1]
        name = mixer.LOOP.token_state.name
        with self.changed(_Renamed(name, f"{name}_v2", scope=mixer.LOOP.function), "renamed_state") as model:
            self._assert_named(model, name)

    # -- knockout -----------------------------------------------------------------------

    def test_knocked_out_token_leaves_the_sums(self) -> None:
        """``nnterp.analysis.knock_out``: the knocked token's exp(k) is 0 in every later sum and in its own bonus term."""
        from nnterp.analysis import knock_out

        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        clean = self.read_prompt(layer)
        token = clean["keys"].shape[1] // 2
        read: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            knock_out(self.model, [token], layers=[layer])
            read.extend((mixer.attention_keys.save(), mixer.attention_head_outputs.save()))
        keys = clean["keys"].clone()
        keys[:, token] = float("-inf")
        outputs, _, _ = paper_wkv(clean["decays"], clean["bonus"], keys, clean["values"], clean["state_input"])
        close(read[1][:, :token], clean["outputs"][:, :token], ATOL, "outputs before the knocked token")
        close_relative(read[1], outputs, "outputs vs the paper's recurrence without the knocked token")
        assert not torch.allclose(read[1][:, token + 1 :], clean["outputs"][:, token + 1 :])

    def test_knocking_out_the_first_token_gives_no_nan(self) -> None:
        from nnterp.analysis import knock_out

        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        clean = self.read_prompt(layer)
        read: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            knock_out(self.model, [0], layers=[layer])
            read.append(mixer.attention_head_outputs.save())
        keys = clean["keys"].clone()
        keys[:, 0] = float("-inf")
        outputs, _, _ = paper_wkv(clean["decays"], clean["bonus"], keys, clean["values"])
        assert torch.isfinite(read[0]).all()
        # with nothing before it, the first token reads only itself, as without the knockout
        close(read[0][:, 0], clean["outputs"][:, 0], ATOL, "the knocked first token's own output")
        close_relative(read[0][:, 1:], outputs[:, 1:], "later outputs vs the paper's recurrence without token 0")

    def test_patch_state_continues_from_everything_the_source_carried(self) -> None:
        """``patch_state`` at t in every block gives, after t, the logits of the source's tokens up to t followed by
        the target's after it: every block's WKV state and both token shifts' last inputs carried; before t the target's own, token t's too (its output reads the state before it)."""
        check_patch_state_joins_the_prompts(self.model, patched_token_keeps_its_output=True)
