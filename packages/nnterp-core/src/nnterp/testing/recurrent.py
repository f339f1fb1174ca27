"""RecurrentMixerSuite: the properties of every recurrent mixer's state trajectory, and the checks its math shares.

``state_trajectory`` computes the state after every token of a kernel call
from the call's arguments; the mixer's ``states`` serve the same states from
inside the model (a routed token loop, or Mamba-2 chunked one token at a
time). A family plugin's suite subclasses ``RecurrentMixerSuite`` and says how
``states`` is served on its class's model (``per_token_states``) and which of
the call's arguments an assignment may replace (``ASSIGNABLE``); every check
then compares the two, on a prompt, a left-padded batch, each decode step of
``generate``, and after assignments.
"""

from __future__ import annotations

import inspect
import unittest
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from transformers.integrations import use_kernel_func_from_hub_with_fallback

from ..analysis.patching import patch_state
from ..availability import Unavailable
from ..components.call_site import CACHE_ARGUMENTS
from ..components.declaration import forward_layout, modeling_module
from ..components.per_token import PerToken
from ..components.recurrent import RecurrentMixer
from ..components.routing import route_kernels
from ..forward_source import callee
from ..order import OrderError
from ..registry import REGISTRY
from .mixing import TokenMixingSuite
from .models import tiny_standardized
from .order import TraceOrderSuite
from .suites import ATOL, BATCH, PROMPT, blocks_with, close, raises

#: How far a computed trajectory may be from the model's own states, relative to their largest entry (float32).
TRAJECTORY_TOLERANCE = 1e-5
#: Decode steps the generate checks take.
STEPS = 3
#: Tokens a speculative-decoding cache keeps the states of, in the kept-states checks.
KEPT = 3
#: The values a call that keeps states serves whole, compared with a call that keeps none, in the order they are read
#: on the plain call.
ACROSS_CALLS = (
    "attention_queries",
    "attention_keys",
    "attention_values",
    "decays",
    "betas",
    "attention_head_outputs",
    "state_output",
    "state_trajectory",
)
#: ``positions=`` selections of a 150-token call, each kind the argument takes, and their test ids.
POSITIONS = (
    5,
    -1,
    slice(None, None, 64),
    slice(10, 140, 7),
    slice(None, None, -9),
    [149, 3, 64, 3, -2],
    torch.tensor([63, 0, 64]),
    [],
)
POSITION_IDS = ("int", "negative", "every_64th", "range", "reversed", "list", "tensor", "none")


def mild_decays(model: Any) -> Any:
    """Give ``model``'s recurrent mixers decays as mild as a trained model's; returns the model.

    A tiny random model forgets its state within a token; with exp(A_log) in [0.005, 0.05] a state
    carries from one token to the next, and Mamba-1 steps of about 1.3 (softplus of a dt bias of 1)
    make its tokens write as much as its skip term adds.
    """
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in blocks_with(model, "linear_attn"):
            for name, weight in model.layers[layer].linear_attn._module.named_parameters():
                if name.endswith("A_log"):
                    weight.copy_(torch.empty(weight.shape).uniform_(0.005, 0.05, generator=generator).log())
                if name == "dt_proj.bias":
                    weight.fill_(1.0)
    return model


def close_relative(
    actual: torch.Tensor, expected: torch.Tensor, what: str = "", tolerance: float = TRAJECTORY_TOLERANCE
) -> None:
    """Assert ``actual`` is ``expected`` within ``tolerance`` of ``expected``'s largest entry, naming ``what``."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if not expected.numel():
        return
    error = ((actual.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    assert error <= tolerance, f"{what}: relative error {error:.2e} (tolerance {tolerance:.0e})"


def selected(states: torch.Tensor, positions: Any) -> torch.Tensor:
    """``states[:, positions]``, also for the negative-step slices torch's indexing refuses."""
    if isinstance(positions, slice):
        return states[:, list(range(states.shape[1])[positions])]
    return states[:, positions]


def check_positions(compute: Callable[..., torch.Tensor], positions: Any) -> None:
    """``compute(positions=positions)`` is the slice of ``compute()`` that ``positions`` indexes."""
    close_relative(compute(positions=positions), selected(compute(), positions), f"positions={positions!r}", 1e-6)


def check_patch_state_joins_the_prompts(
    model: Any, t: int = 5, tolerance: float = ATOL, patched_token_keeps_its_output: bool = False
) -> None:
    """``patch_state`` at ``t`` in every block gives, after ``t``, the logits of the source's tokens up to ``t``
    followed by the target's: everything each block carries past ``t`` (a state, a token shift, a normalizer, a
    conv window, keys and values) comes from the source.

    Before ``t`` the target's logits are its own, and at ``t`` too where the
    kind's token reads the state before itself (``patched_token_keeps_its_output``,
    RWKV). The source's state must change every later logit, or the check
    would pass with nothing carried.
    """
    source = "Hi you there, friend of mine"
    ids = [model.tokenizer(prompt, return_tensors="pt").input_ids for prompt in (source, PROMPT)]
    read: list[torch.Tensor] = []
    with model.trace(ids[1]):
        read.append(model.logits.save())
    with model.trace(torch.cat([ids[0][:, : t + 1], ids[1][:, t + 1 :]], dim=1)):
        read.append(model.logits.save())
    clean, joined = read
    changes = patch_state(model, source, PROMPT, [t], metric=lambda logits: logits.float())
    own = t + 1 if patched_token_keeps_its_output else t
    close(changes[:, :own], torch.zeros_like(changes[:, :own]), tolerance, "patch_state: the target's own logits")
    close(clean[:, t + 1 :] + changes[:, t + 1 :], joined[:, t + 1 :], tolerance, "patch_state vs the joined prompt")
    assert (joined - clean)[:, t + 1 :].abs().amax(dim=-1).min() > 1e-6, "the source's state changed no later logit"


class RecurrentMixerSuite(TokenMixingSuite, TraceOrderSuite):
    """``state_trajectory`` is the state the model itself carries, after every token of every call.

    It carries the trace contract's order matrix too (``TraceOrderSuite``), on
    the first block with a recurrent mixer, and the token mixing's identity
    (``TokenMixingSuite``).
    """

    #: The values at the kernel call an assignment may replace; the trajectory must follow each.
    ASSIGNABLE: ClassVar[tuple[str, ...]] = ("attention_keys", "attention_values")
    #: Whether a prompt's kernel takes a starting state, so that ``state_input`` may be assigned on a prompt.
    PROMPT_STATE_INPUT: ClassVar[bool] = True

    @classmethod
    def strategy(cls) -> PerToken:
        """How the family's recurrent mixers get the state after every token (their ``PER_TOKEN``)."""
        strategies = {
            envoy.PER_TOKEN
            for envoy in REGISTRY.family(cls.family).ENVOYS.values()
            if isinstance(envoy, type) and issubclass(envoy, RecurrentMixer)
        }
        assert len(strategies) == 1, f"{cls.family}: its mixers get per-token states {len(strategies)} ways"
        return strategies.pop()

    @classmethod
    def routed(cls) -> bool:
        """Whether the class's model runs its family routed (``route_kernels(family, "torch")``, for the class and back
        after it), which is how a token loop's ``states`` serve every token."""
        return cls.strategy().routed

    @classmethod
    def setup_class(cls) -> None:
        if cls.routed():
            route_kernels(REGISTRY.family(cls.family), "torch")
        super().setup_class()

    @classmethod
    def teardown_class(cls) -> None:
        if cls.routed():
            with warnings.catch_warnings():
                # the class's model was traced routed, as intended
                warnings.filterwarnings("ignore", r"route_kernels\(\.\.\., 'default'\)")
                route_kernels(REGISTRY.family(cls.family), "default")

    def recurrent_layers(self) -> list[int]:
        """The blocks with a recurrent mixer (``linear_attn``); call it outside a trace."""
        layers = blocks_with(self.model, "linear_attn")
        assert layers, f"{self.family}: no block has a linear_attn"
        return layers

    @contextmanager
    def per_token_states(self) -> Iterator[None]:
        """Where the mixers' ``states`` serve every token's state: routed, the class's model as it is; else with the
        strategy's per-model switch on (a Mamba-2's ``chunk_per_token``), and off again after."""
        if self.routed():
            yield
            return
        self.strategy().enable(self.model)
        try:
            yield
        finally:
            self.strategy().enable(self.model, enabled=False)

    @contextmanager
    def default_kernels(self) -> Iterator[None]:
        """The family's kernels as transformers binds them, for a model built inside; routed again after, if ``routed()``."""
        family = REGISTRY.family(self.family)
        if self.routed():
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", r"route_kernels\(\.\.\., 'default'\)")
                route_kernels(family, "default")
        try:
            yield
        finally:
            if self.routed():
                with warnings.catch_warnings():
                    # the class's model was traced under "torch" and keeps it, as intended
                    warnings.filterwarnings("ignore", r"route_kernels\(\.\.\., 'torch'\): .* already traced")
                    route_kernels(family, "torch")

    def mixer(self, layer: int) -> Any:
        return self.model.layers[layer].linear_attn

    def order_layer(self) -> int:
        return self.recurrent_layers()[0]

    def trajectories_and_states(self, prompt: str | list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each mixer's ``state_trajectory`` on a plain trace of ``prompt``, beside its ``states`` under ``per_token_states``."""
        layers = self.recurrent_layers()
        trajectories: list[torch.Tensor] = []  # bound outside: a name first bound inside a trace does not survive it
        states: list[torch.Tensor] = []
        with self.model.trace(prompt):
            trajectories.extend(self.mixer(layer).state_trajectory.save() for layer in layers)
        with self.per_token_states(), self.model.trace(prompt):
            states.extend(self.mixer(layer).states.save() for layer in layers)
        return list(zip(trajectories, states, strict=True))

    def test_state_trajectory_is_the_models_states(self) -> None:
        for layer, (trajectory, states) in zip(
            self.recurrent_layers(), self.trajectories_and_states(PROMPT), strict=True
        ):
            close_relative(trajectory, states, f"layers[{layer}] state_trajectory vs states on a prompt")
            assert trajectory.dtype == states.dtype

    def test_state_trajectory_under_the_default_kernels(self) -> None:
        """On a model built under the default kernels, where ``states`` cannot serve every token, the trajectory is the
        class's model's per-token states: routed, or under ``per_token_states`` (a Mamba-2's ``chunk_per_token``)."""
        layers = self.recurrent_layers()
        trajectories: list[torch.Tensor] = []
        states: list[torch.Tensor] = []
        with self.default_kernels():
            unrouted = self.build_model()
            support = unrouted.support(layer=layers[0])
            with unrouted.trace(PROMPT):
                trajectories.extend(unrouted.layers[layer].linear_attn.state_trajectory.save() for layer in layers)
        with self.per_token_states():
            served = self.model.support(layer=layers[0])["linear_attn.states"]
            with self.model.trace(PROMPT):
                states.extend(self.mixer(layer).states.save() for layer in layers)
        assert served is None, f"states under per_token_states: support says {served!r}"
        # routed, the hint to route; else what the class's model, on the default kernels too, says outside per_token_states
        hint = (
            type(self.mixer(layers[0])).PER_TOKEN.hint
            if self.routed()
            else self.model.support(layer=layers[0])["linear_attn.states"]
        )
        assert hint is not None, "on the default kernels, support says states serve every token"
        assert support["linear_attn.states"] == hint, f"unrouted states: support says {support['linear_attn.states']!r}"
        assert support["linear_attn.state_trajectory"] is None, support["linear_attn.state_trajectory"]
        for layer, trajectory, expected in zip(layers, trajectories, states, strict=True):
            close_relative(trajectory, expected, f"layers[{layer}] unrouted state_trajectory vs per-token states")

    def test_state_trajectory_in_a_left_padded_batch(self) -> None:
        tokenizer = self.model.tokenizer
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        try:
            pairs = self.trajectories_and_states(list(BATCH))
        finally:
            tokenizer.padding_side = side
        for layer, (trajectory, states) in zip(self.recurrent_layers(), pairs, strict=True):
            for row, prompt in enumerate(BATCH):
                real = len(tokenizer(prompt).input_ids)
                close_relative(
                    trajectory[row, -real:], states[row, -real:], f"layers[{layer}] {prompt!r} in a padded batch"
                )

    def test_state_trajectory_on_decode_steps_continues_the_cache(self) -> None:
        """Read after ``state_output``: the order of reads does not matter, though the cached state is overwritten."""
        layers = self.recurrent_layers()
        trajectories: list[list[torch.Tensor]] = [[] for _ in layers]
        stacks: list[list[torch.Tensor]] = [[] for _ in layers]
        with (
            self.per_token_states(),
            self.model.generate(PROMPT, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False) as tracer,
        ):
            for _ in tracer.iter[:STEPS]:
                for index, layer in enumerate(layers):
                    mixer = self.mixer(layer)
                    stacks[index].append(mixer.states.save())
                    mixer.state_output.save()
                    trajectories[index].append(mixer.state_trajectory.save())
        for layer, steps, expected in zip(layers, trajectories, stacks, strict=True):
            assert len(steps) == STEPS and steps[-1].shape[1] == 1, "a decode step's trajectory is one token"
            for step, (trajectory, states) in enumerate(zip(steps, expected, strict=True)):
                close_relative(trajectory, states, f"layers[{layer}] step {step}: state_trajectory vs states")

    def test_state_trajectory_of_a_call_continuing_a_cache(self) -> None:
        """Several tokens after a cached prompt, read at the mixer's output: the cache it started from is overwritten by then."""
        ids = self.model.tokenizer(PROMPT, return_tensors="pt").input_ids
        split = ids.shape[1] // 2
        module = self.model._module
        accepted = inspect.signature(module.forward).parameters
        name = next(name for name in CACHE_ARGUMENTS if name in accepted)
        layers = self.recurrent_layers()
        read: list[torch.Tensor] = []
        with self.per_token_states():
            prompt = module(ids[:, :split], use_cache=True)
            cache = next(getattr(prompt, name) for name in CACHE_ARGUMENTS if getattr(prompt, name, None) is not None)
            with self.model.trace(ids[:, split:], use_cache=True, **{name: cache}):
                for layer in layers:
                    mixer = self.mixer(layer)
                    read.append(mixer.states.save())
                    mixer.output.save()
                    read.append(mixer.state_trajectory.save())
        for layer, states, trajectory in zip(layers, read[::2], read[1::2], strict=True):
            close_relative(trajectory, states, f"layers[{layer}] state_trajectory of a call continuing a cache")

    def test_state_trajectory_follows_assignments_made_after_other_reads(self) -> None:
        """An assignment made after the call's arguments were first read still reaches the trajectory."""
        mixer = self.mixer(self.recurrent_layers()[0])
        untouched: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            untouched.append(mixer.state_trajectory.save())
        for name in self.ASSIGNABLE:
            read: list[torch.Tensor] = []
            with self.per_token_states(), self.model.trace(PROMPT):
                mixer.attention_queries.save()
                setattr(mixer, name, getattr(mixer, name) * 0.5)
                read.extend((mixer.state_trajectory.save(), mixer.states.save()))
            trajectory, states = read
            close_relative(trajectory, states, f"state_trajectory vs states after assigning {name}")
            assert not torch.allclose(trajectory, untouched[0]), f"assigning {name} left the states as they were"

    def test_state_trajectory_starts_from_an_assigned_state_input(self) -> None:
        mixer = self.mixer(self.recurrent_layers()[0])
        leaving: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1]:
                leaving.append(mixer.state_output.save())
        start = torch.randn(leaving[0].shape, generator=torch.Generator().manual_seed(0))
        read: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1]:
                mixer.state_input = start
                read.extend((mixer.state_output.save(), mixer.state_trajectory.save()))
        assert not torch.allclose(read[0], leaving[0]), "the assigned state_input did not change the step"
        close_relative(read[1][:, 0], read[0], "a decode step's trajectory after a state_input assignment")
        if not self.PROMPT_STATE_INPUT:
            return
        # a random model's strong decays can forget the starting state by the prompt's end: compare every token's
        read.clear()
        with self.model.trace(PROMPT):
            read.append(mixer.state_trajectory.save())
        with self.per_token_states(), self.model.trace(PROMPT):
            mixer.attention_queries.save()
            mixer.state_input = start
            read.extend((mixer.state_trajectory.save(), mixer.states.save()))
        untouched, trajectory, states = read
        assert not torch.allclose(trajectory[:, 0], untouched[:, 0]), "the assigned state_input changed no state"
        close_relative(trajectory, states, "a prompt's trajectory vs states after a state_input assignment")

    def test_an_optimized_kernel_leaves_only_the_trajectory(self) -> None:
        """With an optimized prompt kernel bound, the values read inside it are unavailable and state_trajectory is not.

        transformers' own hub dispatcher finds an "optimized" implementation in
        an importable package: json stands in for flash-linear-attention or
        mamba_ssm (it is looked at, never called).
        """
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
                compiled = self.build_model()
                support = compiled.support(layer=layer)
                try:
                    with compiled.trace(PROMPT):
                        compiled.layers[layer].linear_attn.attention_queries.save()
                except Unavailable as error:
                    assert "optimized kernel (json)" in str(error), str(error)
                else:
                    raise AssertionError("attention_queries was read past an optimized kernel")
            finally:
                setattr(modeling, name, imported)
        for value in ("attention_queries", "state_output"):
            reason = support[f"linear_attn.{value}"]
            assert reason is not None and "optimized kernel (json)" in reason, f"{value}: {reason!r}"
            assert "nnterp.route_kernels(model.family, 'torch')" in reason, f"{value}: {reason!r}"
        assert support["linear_attn.state_trajectory"] is None, support["linear_attn.state_trajectory"]

    def test_the_trajectory_follows_a_bfloat16_kernel(self) -> None:
        """A bf16 model gives bf16 states: the float32 ones, rounded once."""
        model = tiny_standardized(self.family, dtype=torch.bfloat16, **self.load)
        mixer = model.layers[self.recurrent_layers()[0]].linear_attn
        read: list[torch.Tensor] = []
        with model.trace(PROMPT):
            read.extend((mixer.state_trajectory.save(), mixer.trajectory(dtype=torch.float32).save()))
        assert read[0].dtype == torch.bfloat16 and read[1].dtype == torch.float32
        assert torch.equal(read[0], read[1].to(torch.bfloat16))

    def test_trajectory_positions_select_the_full_trajectory(self) -> None:
        selections = (slice(1, None, 2), [-1, 0, 3], 2)
        mixer = self.mixer(self.recurrent_layers()[0])
        read: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            full = mixer.state_trajectory.save()
            read.extend(mixer.trajectory(positions=positions).save() for positions in selections)
            read.append(mixer.trajectory(positions=-1, dtype=torch.float64).save())
        for positions, states in zip(selections, read, strict=False):
            close_relative(states, selected(full, positions), f"trajectory(positions={positions!r}) vs the full one")
        assert read[-1].dtype == torch.float64
        close_relative(read[-1], full[:, -1], "trajectory(positions=-1, dtype=float64)")

    # -- a prompt over a cache that keeps its last tokens' states (speculative decoding) ------------------------

    def kept_cache(self) -> dict[str, Any]:
        """A cache that keeps the states of a prompt's last ``KEPT`` tokens, as speculative decoding asks, as the
        keyword argument the model takes it under.

        Skips where the installed forward keeps none (transformers before 5.25).
        """
        mixer = self.mixer(self.recurrent_layers()[0])
        if forward_layout(type(mixer), type(mixer._module)).kept is None:
            raise unittest.SkipTest(
                f"{type(mixer._module).__name__}'s forward keeps no states for speculative decoding"
            )
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model._module.config)
        cache.activate_past_recording(recurrent_states_to_keep=KEPT)
        accepted = inspect.signature(self.model._module.forward).parameters
        return {next(name for name in CACHE_ARGUMENTS if name in accepted): cache, "use_cache": True}

    def prompt_ids(self) -> torch.Tensor:
        """The prompt's token ids: traced as ids, a multimodal model's cache keyword reaches the model, where with a
        string its processor takes the keywords and drops the cache."""
        return self.model.tokenizer(PROMPT, return_tensors="pt").input_ids

    def test_a_call_keeping_states_serves_every_value_whole(self) -> None:
        """The prompt's kernel, then the decode kernel once per kept token: every value over all of the prompt's
        tokens, equal to a call that keeps none, read in any order."""
        cache = self.kept_cache()
        layers = self.recurrent_layers()
        support = self.model.support(layer=layers[0])
        names = [name for name in ACROSS_CALLS if support[f"linear_attn.{name}"] is None]
        plain: list[torch.Tensor] = []
        kept: list[torch.Tensor] = []
        ids = self.prompt_ids()
        with self.model.trace(ids):
            for layer in layers:
                plain.extend(getattr(self.mixer(layer), name).save() for name in names)
                plain.append(self.mixer(layer).token_mixing().save())
            plain.append(self.model.logits.save())
        with self.model.trace(ids, **cache):
            for layer in layers:
                mixer = self.mixer(layer)
                read = {name: getattr(mixer, name).save() for name in reversed(names)}
                kept.extend(read[name] for name in names)
                kept.append(mixer.token_mixing().save())
            kept.append(self.model.logits.save())
        labels = [f"layers[{layer}].{name}" for layer in layers for name in (*names, "token_mixing")] + ["logits"]
        for label, expected, actual in zip(labels, plain, kept, strict=True):
            close_relative(actual, expected, f"{label} on a call keeping {KEPT} states")

    def test_a_call_keeping_states_serves_its_states_and_refuses_writes(self) -> None:
        cache = self.kept_cache()
        mixer = self.mixer(self.recurrent_layers()[0])
        plain: list[torch.Tensor] = []
        kept: list[torch.Tensor] = []
        ids = self.prompt_ids()
        with self.per_token_states():
            with self.model.trace(ids):
                plain.extend((mixer.states.save(), mixer.state_output.save()))
            with self.model.trace(ids, **cache):
                kept.extend((mixer.states.save(), mixer.state_after(-1).save(), mixer.state_output.save()))
                with raises(OrderError, "keeps the states of its last"):
                    mixer.attention_keys = mixer.attention_keys * 0
                if self.model.support(layer=self.recurrent_layers()[0])["linear_attn.state"] is None:
                    with raises(OrderError, "keeps the states of its last"):
                        mixer.set_state_after(0, kept[1])
        close_relative(kept[0], plain[0], f"states on a call keeping {KEPT} states")
        close_relative(kept[1], kept[2], "state_after(-1) vs state_output on a call keeping states")
        close_relative(kept[2], plain[1], "state_output on a call keeping states")

    def test_a_decode_step_continues_a_call_keeping_states(self) -> None:
        """The cache a call keeping states leaves is what the next step starts from, and that step reads as usual."""
        cache = self.kept_cache()
        layer = self.recurrent_layers()[0]
        mixer = self.mixer(layer)
        ids = self.prompt_ids()
        read: list[torch.Tensor] = []
        with self.model.trace(ids, **cache):
            read.append(mixer.state_output.save())
        with self.model.trace(ids[:, -1:], **cache):
            read.extend((mixer.state_input.save(), mixer.state_trajectory.save(), mixer.state_output.save()))
        leaving, entering, trajectory, final = read
        close_relative(entering, leaving, "the decode step's state_input vs the kept call's state_output")
        close_relative(trajectory[:, -1], final, "the decode step's trajectory vs its state_output")
