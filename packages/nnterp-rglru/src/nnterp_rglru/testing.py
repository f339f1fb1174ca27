"""RgLruSuite and LocalAttentionSuite: the properties of Griffin's mixers, checked on a family's tiny model.

Every check compares served values with an independent computation: the Griffin paper's
recurrence in float64 from the served inputs and gates, transformers' own forward, the next call's
state, or a changed output after a write. ``RgLruSuite`` carries core's recurrent-mixer suites
(``RecurrentMixerSuite``: the trajectory, the token mixing, the trace contract's order matrix) and
the forward-change faults (``ForwardChangeSuite``), those acting on a kernel adapted to a scan the
forward calls as a method; ``LocalAttentionSuite`` is core's ``AttentionSuite`` over a sliding window.
"""

from __future__ import annotations

import ast
import inspect
import math
import unittest
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
import transformers
from transformers import DynamicCache

from nnterp import Unavailable
from nnterp.analysis import knock_out
from nnterp.components.call_site import CACHE_ARGUMENTS
from nnterp.order import OrderError
from nnterp.testing import (
    ATOL,
    PROMPT,
    AttentionSuite,
    RecurrentMixerSuite,
    blocks_with,
    check_patch_state_joins_the_prompts,
    close,
    tiny_standardized,
)
from nnterp.testing.forward_change import ForwardChangeSuite
from nnterp.testing.suites import BATCH, raises

#: Decode steps the generate checks take.
STEPS = 3
#: softplus(c) of the mild decays the write checks set: a = exp(-8 r softplus(c)) >= 0.99 for every gate r.
MILD = 1e-3


def griffin_reference(
    x: torch.Tensor, input_gate: torch.Tensor, a: torch.Tensor, reset: torch.Tensor, state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The RG-LRU from the Griffin paper, in float64: ``h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t x_t)``.

    ``reset`` [batch, seq] marks a document's first token, where the state starts over and the input
    is not normalized. Returns the states after every token and the last one.
    """
    x, input_gate, a = x.double(), input_gate.double(), a.double()
    h = torch.zeros_like(x[:, 0]) if state is None else state.double()
    states = []
    for t in range(x.shape[1]):
        start = reset[:, t, None]
        keep = torch.where(start, 0.0, a[:, t])
        scale = torch.where(start, 1.0, torch.sqrt(1 - a[:, t] ** 2))
        h = keep * h + scale * input_gate[:, t] * x[:, t]
        states.append(h)
    return torch.stack(states, 1), h


def windowed(seq: int, window: int) -> torch.Tensor:
    """Which keys each query of a local attention sees, [seq, seq]: the causal ones, and of those the last ``window``."""
    seen = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
    return seen & ~torch.tril(seen, -window)


class LocalAttentionSuite(AttentionSuite):
    """Softmax attention over a sliding window (``LocalAttention``): ``AttentionSuite``, each query seeing its window."""

    def test_zero_queries_give_uniform_causal_pattern(self) -> None:
        """Zero queries give each query a uniform pattern over the keys it sees: its window of earlier ones."""
        self.skip_unless_causal()
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            with self.model.trace(PROMPT):
                attention.attention_queries = torch.zeros_like(attention.attention_queries)
                pattern = attention.attention_probabilities.save()
            seen = windowed(pattern.shape[-1], attention.window).float()
            expected = (seen / seen.sum(-1, keepdim=True)).expand_as(pattern)
            close(pattern, expected, what=f"layers[{layer}] pattern under zero queries, window {attention.window}")

    def test_a_query_sees_no_key_before_its_window(self) -> None:
        """The window is the model's own: a key before a query's window has no share of its pattern."""
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            assert attention.window == self.model._module.config.attention_window_size
            with self.model.trace(PROMPT):
                pattern = attention.attention_probabilities.save()
            seen = windowed(pattern.shape[-1], attention.window)
            assert (~seen).tril().any(), f"the test prompt is not longer than the window {attention.window}"
            assert pattern[..., ~seen].abs().max() == 0, f"layers[{layer}]: a query attends outside its window"
            assert (pattern[..., seen] > 0).all(), f"layers[{layer}]: a key inside the window has no share"


#: Why the faults that swap in an optimized kernel do not apply: the scan is a method, never a hub kernel.
A_METHOD = (
    "the RG-LRU's scan is a method of its module (self._rnn_scan), which transformers' hub dispatcher never "
    "replaces: there is no optimized kernel to bind, and states serve every token on every model"
)


def _method(call: Any) -> str:
    """The method name of a kernel the forward calls as ``self.<name>``."""
    return call.function.removeprefix("self.")


def _calls_method(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    )


class _MethodRenamed(ast.NodeTransformer):
    """The method ``old`` renamed ``new``: its ``def`` and every ``self.old`` that calls it."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if node.name == self.old:
            node.name = self.new
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if _calls_method(node, self.old):
            node.func.attr = self.new
        return node


class _StateRenamed(ast.NodeTransformer):
    """In the method ``scope``, the state its loop binds (``name``, also its parameter) renamed ``new`` past the entry.

    The parameter keeps its name and is copied to ``new`` first: the method computes the same, binding another name.
    """

    def __init__(self, scope: str, name: str, new: str) -> None:
        self.scope, self.name, self.new = scope, name, new

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if node.name != self.scope:
            return node
        for child in ast.walk(node):
            if isinstance(child, ast.Name) and child.id == self.name:
                child.id = self.new
        copy = ast.Assign([ast.Name(self.new, ast.Store())], ast.Name(self.name, ast.Load()))
        node.body.insert(0, copy)
        return node


class _MethodCalledTwice(ast.NodeTransformer):
    """The statement calling the method ``name`` made twice: the forward calls its scan two times."""

    def __init__(self, name: str) -> None:
        self.name = name

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field in ("body", "orelse"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                twice = []
                for statement in body:
                    if isinstance(statement, (ast.Assign, ast.Expr)) and any(
                        _calls_method(child, self.name) for child in ast.walk(statement)
                    ):
                        twice.append(statement)
                    twice.append(statement)
                setattr(node, field, twice)
        return node


class _MethodReordered(ast.NodeTransformer):
    """The method ``name``'s first three parameters after ``self`` in reverse order (its forward passes them by
    keyword)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if node.name == self.name:
            node.args.args[1:4] = node.args.args[1:4][::-1]
        return node


class RgLruSuite(RecurrentMixerSuite, ForwardChangeSuite):
    """The conformance suite of a family with an RG-LRU at ``linear_attn``."""

    #: The scan's arguments an assignment may replace.
    ASSIGNABLE: ClassVar[tuple[str, ...]] = ("attention_values", "recurrence_gates")
    # a prompt starts at position 0, where the scan drops the state it was given
    PROMPT_STATE_INPUT = False
    RECURRENT: ClassVar[tuple[str, ...]] = ("attention_values", "attention_head_outputs", "state_trajectory")

    def recurrent_layers(self) -> list[int]:
        return blocks_with(self.model, "linear_attn")

    def mixer(self, layer: int) -> Any:
        return self.model.layers[layer].linear_attn

    @contextmanager
    def per_token_states(self) -> Iterator[None]:
        """The scan's loop binds every token's state on every model: nothing to turn on."""
        yield

    def read_prompt(self, layer: int, prompt: Any = PROMPT) -> dict[str, torch.Tensor]:
        mix = self.mixer(layer)
        read: dict[str, Any] = {}
        with self.model.trace(prompt):
            read["y"] = mix.output_gates.save()
            read["x"] = mix.conv_output.save()
            read["i"] = mix.input_gates.save()
            read["entering"] = mix.state_input.save()
            read["values"] = mix.attention_values.save()
            read["a"] = mix.recurrence_gates.save()
            read["decays"] = mix.decays.save()
            read["states"] = mix.states.save()
            read["h"] = mix.attention_head_outputs.save()
            read["final"] = mix.state_output.save()
            read["output"] = mix.attention_output.save()
        return read

    def mild_decays(self, layer: int) -> Any:
        """Set the layer's decays mild, so a state write shows at later tokens; returns the restoring closure."""
        param = self.mixer(layer)._module.recurrent_param
        saved = param.detach().clone()
        with torch.no_grad():
            param.fill_(math.log(math.expm1(MILD)))

        def restore() -> None:
            with torch.no_grad():
                param.copy_(saved)

        return restore

    # -- the recurrence ------------------------------------------------------------------

    def test_states_are_the_griffin_recurrence(self) -> None:
        for layer in self.recurrent_layers():
            read = self.read_prompt(layer)
            reset = torch.zeros(read["x"].shape[:2], dtype=torch.bool)
            reset[:, 0] = True  # position 0: a document's first token
            states, final = griffin_reference(read["x"], read["i"], read["a"], reset, read["entering"])
            close(read["states"], states, ATOL, f"layers[{layer}] states vs the Griffin recurrence")
            close(read["h"], states, ATOL, f"layers[{layer}] attention_head_outputs vs the Griffin recurrence")
            close(read["final"], final, ATOL, f"layers[{layer}] state_output vs the Griffin recurrence")
            assert torch.equal(read["states"][:, -1], read["final"]), "states[:, -1] != state_output"
            close(read["decays"], torch.log(read["a"]), ATOL, f"layers[{layer}] decays vs log a")
            scale = torch.sqrt(1 - read["a"].double() ** 2)
            scale[:, 0] = 1
            close(read["values"], scale * read["i"] * read["x"], ATOL, f"layers[{layer}] attention_values")

    def test_values_are_transformers_own(self) -> None:
        layer = self.recurrent_layers()[0]
        block = self.mixer(layer).parent._module
        seen: dict[str, torch.Tensor] = {}
        hooks = [
            block.rg_lru.register_forward_hook(lambda m, i, o: seen.update(h=o.detach().clone())),
            block.register_forward_hook(lambda m, i, o: seen.update(out=o[0].detach().clone())),
        ]
        try:
            ids = self.model.tokenizer(PROMPT, return_tensors="pt").input_ids
            with torch.no_grad():
                self.model._module(ids)
        finally:
            for hook in hooks:
                hook.remove()
        read = self.read_prompt(layer)
        close(read["h"], seen["h"], ATOL, "attention_head_outputs vs the RG-LRU's own output")
        close(read["output"], seen["out"], ATOL, "attention_output vs the recurrent block's own output")
        with self.model.trace(PROMPT):
            u = self.model.layers[layer].attention_norm_output.save()
        expected_y = block.act_fn(block.linear_y(u))
        close(read["y"], expected_y, ATOL, "output_gates vs gelu(linear_y(u))")
        close(block.linear_out(read["h"] * read["y"]), read["output"], ATOL, "linear_out(h * y) vs attention_output")

    def test_trajectory_is_the_models_states(self) -> None:
        for layer in self.recurrent_layers():
            mix = self.mixer(layer)
            with self.model.trace(BATCH):
                states = mix.states.save()
                trajectory = mix.state_trajectory.save()
                picked = mix.trajectory(positions=[3, 0]).save()
            close(trajectory, states, ATOL, f"layers[{layer}] state_trajectory vs states, padded batch")
            close(picked, states[:, [3, 0]], ATOL, "trajectory(positions=[3, 0])")

    def test_layer_adds_the_mixer_and_the_mlp(self) -> None:
        for layer in self.recurrent_layers():
            block = self.model.layers[layer]
            with self.model.trace(PROMPT):
                entering = block.layer_input.save()
                added = block.linear_attn.attention_output.save()
                mlp = block.mlp.mlp_output.save()
                leaving = block.layer_output.save()
            close(entering + added + mlp, leaving, ATOL, f"layers[{layer}] layer_input + attention + mlp")

    # -- writes ---------------------------------------------------------------------------

    def test_state_write_changes_later_tokens_only(self) -> None:
        layer = self.recurrent_layers()[0]
        restore = self.mild_decays(layer)
        try:
            clean = self.read_prompt(layer)
            mix = self.mixer(layer)
            t = 2
            with self.model.trace(PROMPT):
                mix.set_state_after(t, torch.full_like(clean["final"], 3.0))
                h = mix.attention_head_outputs.save()
                logits = self.model.logits.save()
            with self.model.trace(PROMPT):
                clean_logits = self.model.logits.save()
        finally:
            restore()
        # the scan's output at t is the state after t: the written one
        close(h[:, :t], clean["h"][:, :t], ATOL, "outputs before the written token")
        close(h[:, t], torch.full_like(h[:, t], 3.0), ATOL, "the written token's output is the written state")
        a = clean["a"].double()
        expected = a[:, t + 1] * 3.0 + clean["values"][:, t + 1].double()
        close(h[:, t + 1], expected, ATOL, "the token after the write continues from it")
        assert (logits[:, -1] - clean_logits[:, -1]).abs().max() > 1e-3, "the write did not reach the last token"
        close(logits[:, :t], clean_logits[:, :t], ATOL, "logits before the written token")

    def test_assigned_state_input_is_where_the_scan_starts(self) -> None:
        layer = self.recurrent_layers()[0]
        mix = self.mixer(layer)
        with self.model.generate(PROMPT, max_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1]:
                mix.state_input = torch.full_like(mix.state_input, 0.5)
                values = mix.attention_values.save()
                a = mix.recurrence_gates.save()
                h = mix.attention_head_outputs.save()
        close(h[:, 0], a[:, 0] * 0.5 + values[:, 0], ATOL, "a decode step from an assigned state_input")

    # -- decoding --------------------------------------------------------------------------

    def test_decode_steps_continue_from_the_prompts_state(self) -> None:
        layer = self.recurrent_layers()[0]
        mix = self.mixer(layer)
        steps: list[dict[str, Any]] = []
        with self.model.generate(PROMPT, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False) as tracer:
            for _ in tracer.iter[:STEPS]:
                steps.append(
                    {
                        "entering": mix.state_input.save(),
                        "values": mix.attention_values.save(),
                        "a": mix.recurrence_gates.save(),
                        "states": mix.states.save(),
                        "h": mix.attention_head_outputs.save(),
                        "final": mix.state_output.save(),
                    }
                )
        for step, (before, after) in enumerate(zip(steps, steps[1:], strict=False), 1):
            assert after["values"].shape[1] == 1, "a decode step is one token"
            close(after["entering"], before["final"], 0, f"step {step}'s state_input vs the last state_output")
            expected = after["a"][:, 0] * after["entering"] + after["values"][:, 0]
            close(after["final"], expected, ATOL, f"step {step}'s state_output vs one step of the recurrence")
            close(after["states"][:, 0], after["final"], 0, f"step {step}'s states vs state_output")

    def test_written_state_output_is_where_the_next_step_starts(self) -> None:
        mix = self.mixer(self.recurrent_layers()[0])
        entering: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[0]:
                mix.state_output = torch.full_like(mix.state_output, 0.25)
            for _ in tracer.iter[1]:
                entering.append(mix.state_input.save())
        close(entering[0], torch.full_like(entering[0], 0.25), 0, "the next step's state_input after a write")

    # -- errors -------------------------------------------------------------------------------

    def test_a_value_before_the_scan_read_after_it_raises(self) -> None:
        mix = self.mixer(self.recurrent_layers()[0])
        with raises(OrderError, "conv_output.*after attention_values"):
            with self.model.trace(PROMPT):
                mix.attention_values.save()
                mix.conv_output.save()

    def test_decode_step_state_write_points_to_state_output(self) -> None:
        mix = self.mixer(self.recurrent_layers()[0])
        with raises(Unavailable, "write state_output"):
            with self.model.generate(PROMPT, max_new_tokens=2, do_sample=False) as tracer:
                for _ in tracer.iter[1]:
                    mix.set_state_after(0, torch.zeros_like(mix.state_output))

    # -- core's recurrent-mixer suite, where a scan that is a method differs --------------------------------

    def test_state_trajectory_under_the_default_kernels(self) -> None:
        raise unittest.SkipTest(A_METHOD)

    def test_an_optimized_kernel_leaves_only_the_trajectory(self) -> None:
        raise unittest.SkipTest(A_METHOD)

    def test_state_trajectory_follows_assignments_made_after_other_reads(self) -> None:
        """An assignment made after the call's arguments were first read still reaches the trajectory."""
        mixer = self.mixer(self.recurrent_layers()[0])
        untouched: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            untouched.append(mixer.state_trajectory.save())
        for name in self.ASSIGNABLE:
            other = next(value for value in self.ASSIGNABLE if value != name)
            read: list[torch.Tensor] = []
            with self.model.trace(PROMPT):
                getattr(mixer, other).save()
                setattr(mixer, name, getattr(mixer, name) * 0.5)
                read.extend((mixer.state_trajectory.save(), mixer.states.save()))
            trajectory, states = read
            close(trajectory, states, ATOL, f"state_trajectory vs states after assigning {name}")
            assert not torch.allclose(trajectory, untouched[0]), f"assigning {name} left the states as they were"

    # -- a changed forward: the faults on a scan the forward calls as a method ------------------------------

    def scan(self) -> str:
        return _method(self.mixers()[0][1].PROMPT)

    def test_renamed_kernel_is_named(self) -> None:
        scan = self.scan()
        with self.changed(_MethodRenamed(scan, f"{scan}_v2"), "renamed_kernel") as model:
            self._assert_named(model, self.mixers()[0][1].PROMPT.function)

    def test_renamed_state_binding_is_named(self) -> None:
        """The state the scan's token loop binds, renamed inside the method: the values name the binding expected."""
        name = self.mixers()[0][1].PROMPT.token_state.name
        with self.changed(_StateRenamed(self.scan(), name, f"{name}_v2"), "renamed_state") as model:
            self._assert_named(model, name)

    def test_prompt_kernel_called_twice_is_named(self) -> None:
        with self.changed(_MethodCalledTwice(self.scan()), "called_twice") as model:
            self._assert_named(model, "found 2")

    def test_reordered_parameters_serve_the_same_values(self) -> None:
        """The scan's parameters in another order (the forward passes them by keyword): the same values."""
        layer = self._mixer_layer(self.model)
        read: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            mixer = self.model.layers[layer].linear_attn
            read.extend((mixer.attention_values.save(), mixer.recurrence_gates.save(), mixer.states.save()))
        with self.changed(_MethodReordered(self.scan()), "reordered") as model:
            assert model.support(layer=layer)["linear_attn.attention_values"] is None
            with model.trace(PROMPT):
                mixer = model.layers[layer].linear_attn
                read.extend((mixer.attention_values.save(), mixer.recurrence_gates.save(), mixer.states.save()))
        for name, before, after in zip(
            ("attention_values", "recurrence_gates", "states"), read[:3], read[3:], strict=True
        ):
            close(after, before, 0, f"{name} with the scan's parameters reordered")

    def skip_unless_transformers_continues(self, ids: torch.Tensor, split: int, seq: int, cache: dict) -> None:
        """Skip where transformers' own forward cannot run several tokens over a cache (5.20's local attention)."""
        (name,) = cache
        fresh = {name: DynamicCache(config=self.model.config)}
        with torch.no_grad():
            self.model._module(ids[:, :split], use_cache=True, **fresh)
            try:
                self.model._module(ids[:, split:], use_cache=True, position_ids=torch.arange(split, seq)[None], **fresh)
            except RuntimeError as error:
                raise unittest.SkipTest(
                    f"transformers {transformers.__version__}'s RecurrentGemma cannot continue several tokens over "
                    f"a cache: {error}"
                ) from None

    def test_state_trajectory_of_a_call_continuing_a_cache(self) -> None:
        """Several tokens after a prompt, over the cache it filled: the RG-LRU continues the state its module keeps.

        The model returns no cache (the states live on the modules), so the test makes one and passes it to both.
        """
        ids = self.model.tokenizer(PROMPT, return_tensors="pt").input_ids
        split, seq = ids.shape[1] // 2, ids.shape[1]
        accepted = inspect.signature(self.model._module.forward).parameters
        cache = {next(name for name in CACHE_ARGUMENTS if name in accepted): DynamicCache(config=self.model.config)}
        layers = self.recurrent_layers()
        self.skip_unless_transformers_continues(ids, split, seq, cache)
        read: list[torch.Tensor] = []
        with self.model.trace(ids[:, :split], use_cache=True, **cache):
            read.extend(self.mixer(layer).state_output.save() for layer in layers)
        with self.model.trace(ids[:, split:], use_cache=True, position_ids=torch.arange(split, seq)[None], **cache):
            for layer in layers:
                mixer = self.mixer(layer)
                read.append(mixer.state_input.save())
                read.append(mixer.states.save())
                mixer.output.save()
                read.append(mixer.state_trajectory.save())
        count = len(layers)
        for index, layer in enumerate(layers):
            entering, states, trajectory = read[count + 3 * index : count + 3 * index + 3]
            close(entering, read[index], 0, f"layers[{layer}] the continuation's state_input vs the prompt's last")
            close(trajectory, states, ATOL, f"layers[{layer}] state_trajectory of a call continuing the module's state")

    def test_the_trajectory_follows_a_bfloat16_kernel(self) -> None:
        """The scan accumulates in float32 in any model: a bf16 model's states and trajectory are float32, equal."""
        model = tiny_standardized(self.family, dtype=torch.bfloat16, **self.load)
        mixer = model.layers[self.recurrent_layers()[0]].linear_attn
        read: list[torch.Tensor] = []
        with model.trace(PROMPT):
            read.extend((mixer.states.save(), mixer.state_trajectory.save()))
        states, trajectory = read
        assert states.dtype == trajectory.dtype == torch.float32, (states.dtype, trajectory.dtype)
        close(trajectory, states, ATOL, "a bf16 model's state_trajectory vs its scan's states")

    # -- analyses: knocking a token out, continuing from another prompt's state ------------------------------

    def test_knock_out_removes_one_tokens_write(self) -> None:
        """``nnterp.analysis.knock_out`` zeroes the token's write: the state only decays past it; earlier tokens are untouched."""
        layer = self.recurrent_layers()[0]
        mix = self.mixer(layer)
        t = 3
        restore = self.mild_decays(layer)
        try:
            clean = self.read_prompt(layer)
            read: list[torch.Tensor] = []
            with self.model.trace(PROMPT):
                knock_out(self.model, [t], layers=[layer])
                read.extend((mix.states.save(), self.model.logits.save()))
            with self.model.trace(PROMPT):
                read.append(self.model.logits.save())
        finally:
            restore()
        states, logits, clean_logits = read
        close(states[:, :t], clean["states"][:, :t], 0, "states before the knocked token")
        a = clean["a"].double()
        close(states[:, t], a[:, t] * clean["states"][:, t - 1].double(), ATOL, "the knocked token's state: decay only")
        expected = a[:, t + 1] * states[:, t].double() + clean["values"][:, t + 1].double()
        close(states[:, t + 1], expected, ATOL, "the next token writes on the state without the knocked one")
        close(logits[:, :t], clean_logits[:, :t], ATOL, "logits before the knocked token")
        assert (logits[:, -1] - clean_logits[:, -1]).abs().max() > 1e-4, "knocking out the token changed nothing later"

    # -- the convolution's window -----------------------------------------------------------------------------

    def test_a_conv_state_write_changes_the_next_window_of_tokens_only(self) -> None:
        """A window written at the prompt changes the conv output of the next ``conv1d_width - 1`` tokens, no other.

        Token by token over a cache, the same tokens in both runs, in the first block (whose input is the
        embeddings, so only the conv window differs between them).
        """
        layer = self.recurrent_layers()[0]
        mix = self.mixer(layer)
        ids = self.model.tokenizer(PROMPT, return_tensors="pt").input_ids
        split, seq = 6, ids.shape[1]
        accepted = inspect.signature(self.model._module.forward).parameters
        name = next(name for name in CACHE_ARGUMENTS if name in accepted)
        runs: list[list[torch.Tensor]] = []
        for write in (False, True):
            cache = {name: DynamicCache(config=self.model.config)}
            outputs: list[torch.Tensor] = []
            with self.model.trace(ids[:, :split], use_cache=True, **cache):
                if write:
                    mix.conv_state = torch.full_like(mix.conv_state, 2.0)
                outputs.append(mix.conv_output.save())
            for t in range(split, seq):
                with self.model.trace(ids[:, t : t + 1], use_cache=True, position_ids=torch.tensor([[t]]), **cache):
                    outputs.append(mix.conv_output.save())
            runs.append(outputs)
        clean, written = (torch.cat(run, dim=1) for run in runs)
        reach = mix.conv_window
        close(written[:, :split], clean[:, :split], 0, "the prompt's own conv outputs")
        moved = (written - clean).abs().amax(-1)[0] > 1e-4
        assert moved.nonzero().flatten().tolist() == list(range(split, split + reach)), f"changed tokens: {moved}"

    def test_patch_state_continues_from_everything_the_source_carried(self) -> None:
        """``patch_state`` at t in every block gives, after t, the logits of the source's tokens up to t followed by
        the target's after it: every recurrent block's state and conv window, every local attention's keys and values carried; before t the target's own."""
        check_patch_state_joins_the_prompts(self.model)
