"""DeltaNetSuite: the properties every gated-DeltaNet mixer's values must have; and GLM-5-Next's tower's suite.

A family's test class mixes it in with the layer and attention suites::

    class TestQwen3_5Text(LayerSuite, AttentionSuite, DeltaNetSuite):
        family = "qwen3_5_text"

The suite routes the family's kernels to the token-by-token rule before the
class's model is built (``route_kernels(family, "torch")``) and restores them
afterwards, so the per-token state is readable on that model; the checks that
need the default kernels build their own model under them.
"""

from __future__ import annotations

import unittest
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from nnterp import RecurrentMixer, StandardizedTransformer, Unavailable, axis_size, route_kernels
from nnterp.components.declaration import modeling_module
from nnterp.components.per_token import TOKEN_LOOP, TRACED_BEFORE_ROUTING
from nnterp.components.routing import STASH
from nnterp.forward_source import callee
from nnterp.registry import REGISTRY
from nnterp.testing import PROMPT, RecurrentMixerSuite, blocks_with, close
from nnterp.testing.recurrent import BATCH, STEPS
from nnterp_attention.testing import QwenVisionSuite

from .blocks import MissingMixer
from .linear_attention import route_delta_rule

#: The kernel arguments the reference delta rule is computed from, in its order.
DELTA_RULE_INPUTS = ("attention_queries", "attention_keys", "attention_values", "decays", "betas")


@contextmanager
def raises_unavailable(reason: str) -> Iterator[None]:
    """Assert the block raises ``Unavailable`` giving ``reason``."""
    try:
        yield
    except Unavailable as error:
        assert reason in str(error), f"{error} does not give the reason {reason!r}"
    else:
        raise AssertionError(f"nothing raised Unavailable ({reason})")


def _l2_normalized(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def reference_delta_rule(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    decays: torch.Tensor,
    betas: torch.Tensor,
    initial: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, token by token, from what the kernel receives: (states, head outputs).

    Queries and keys are l2-normalized and the queries scaled by
    1/sqrt(key_dim), as the kernel does. Each token decays the state by
    ``exp(decay)`` (one per head, or one per key channel on Kimi), replaces
    what its key retrieves by its value with strength ``beta``, and its query
    reads the updated state.
    """
    keys = _l2_normalized(keys.float())
    queries = _l2_normalized(queries.float()) * keys.shape[-1] ** -0.5
    values, decays, betas = values.float(), decays.float(), betas.float()
    batch, seq, heads, key_dim = keys.shape
    state = torch.zeros(batch, heads, key_dim, values.shape[-1]) if initial is None else initial.float()
    states, outputs = [], []
    for t in range(seq):
        decay = decays[:, t].exp()
        state = state * (decay[..., None] if decay.dim() == 3 else decay[..., None, None])
        remembered = (state * keys[:, t, ..., None]).sum(-2)
        delta = (values[:, t] - remembered) * betas[:, t, ..., None]
        state = state + keys[:, t, ..., None] * delta[..., None, :]
        states.append(state)
        outputs.append((state * queries[:, t, ..., None]).sum(-2))
    return torch.stack(states, 1), torch.stack(outputs, 1)


class DeltaNetSuite(RecurrentMixerSuite):
    """A gated DeltaNet's values: the delta rule they describe, the state after every token, and its writes."""

    ASSIGNABLE = ("attention_keys", "attention_values", "decays", "betas")

    @classmethod
    def build_model(cls) -> StandardizedTransformer:
        """The family's tiny model, with decays as mild as a trained model's.

        Initialized, a head's log decay reaches -16 per token and forgets any
        state within a token, so a wrong starting state would go unseen;
        ``exp(A_log)`` from 0.005 to 0.05 keeps most of it from one token to
        the next.
        """
        model = super().build_model()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for layer in blocks_with(model, "linear_attn"):
                for name, weight in model.layers[layer].linear_attn._module.named_parameters():
                    if name.endswith("A_log"):  # Kimi's sits in its forget gate
                        weight.copy_(torch.empty(weight.shape).uniform_(0.005, 0.05, generator=generator).log())
        return model

    def prompt_length(self) -> int:
        return len(self.model.tokenizer(PROMPT).input_ids)

    def read_mixer(self, layer: int, *names: str) -> list:
        mixer = self.model.layers[layer].linear_attn
        saved: list = []  # bound outside: a name first bound inside a trace does not survive it
        with self.model.trace(PROMPT):
            for name in names:
                value = getattr(mixer, name)
                saved.append(None if value is None else value.save())
        return saved

    # -- the values -------------------------------------------------------------------

    def test_values_have_the_documented_shapes(self) -> None:
        seq = self.prompt_length()
        for layer in self.recurrent_layers():
            mixer = self.model.layers[layer].linear_attn
            heads, key_dim, value_dim = mixer.mixer_heads, mixer.key_dim, mixer.value_dim
            queries, keys, values, decays, betas, entering, heads_out, leaving, output = self.read_mixer(
                layer,
                "attention_queries",
                "attention_keys",
                "attention_values",
                "decays",
                "betas",
                "state_input",
                "attention_head_outputs",
                "state_output",
                "attention_output",
            )
            assert tuple(queries.shape) == tuple(keys.shape) == (1, seq, heads, key_dim)
            assert tuple(values.shape) == tuple(heads_out.shape) == (1, seq, heads, value_dim)
            assert tuple(decays.shape) in ((1, seq, heads), (1, seq, heads, key_dim))
            assert tuple(betas.shape) == (1, seq, heads)
            assert tuple(leaving.shape) == (1, heads, key_dim, value_dim)
            # the contribution's model axes as its layout declares them: hidden_size, or streams and hidden_size
            model_axes = tuple(axis_size(mixer, axis) for axis in type(mixer).attention_output.dims[2:])
            assert tuple(output.shape) == (1, seq, *model_axes), f"attention_output {tuple(output.shape)}"
            assert entering is None, "a fresh prompt starts from no state"
            assert decays.dtype == torch.float32 and decays.max() <= 0, "decays are float32 log-decays"
            assert betas.min() > 0 and betas.max() < 2

    def test_states_follow_the_reference_delta_rule(self) -> None:
        for layer in self.recurrent_layers():
            queries, keys, values, decays, betas, states, heads_out, leaving = self.read_mixer(
                layer,
                "attention_queries",
                "attention_keys",
                "attention_values",
                "decays",
                "betas",
                "states",
                "attention_head_outputs",
                "state_output",
            )
            expected_states, expected_outputs = reference_delta_rule(queries, keys, values, decays, betas)
            close(states, expected_states, what=f"layers[{layer}] states vs the reference delta rule")
            close(heads_out, expected_outputs, what=f"layers[{layer}] head outputs vs the reference delta rule")
            assert torch.equal(states[:, -1], leaving), "states[:, -1] is not state_output"

    def test_state_walks_every_token_like_states(self) -> None:
        seq = self.prompt_length()
        for layer in self.recurrent_layers():
            mixer = self.model.layers[layer].linear_attn
            walked: list = []
            with self.model.trace(PROMPT):
                states = mixer.states.save()
            with self.model.trace(PROMPT) as tracer:
                for _ in tracer.iter[:seq]:
                    walked.append(mixer.state.save())
            with self.model.trace(PROMPT):
                last = mixer.state_after(-1).save()
            close(torch.stack(walked, 1), states, what=f"layers[{layer}] state under tracer.iter vs states")
            assert torch.equal(last, states[:, -1])

    # -- writes --------------------------------------------------------------------------

    def test_state_write_changes_outputs_from_its_token_on(self) -> None:
        t = 2
        for layer in self.recurrent_layers():
            mixer = self.model.layers[layer].linear_attn
            with self.model.trace(PROMPT):
                leaving = mixer.state_output.save()
                clean = mixer.attention_output.save()
            written = torch.randn(leaving.shape, generator=torch.Generator().manual_seed(0))
            arguments: list = []
            with self.model.trace(PROMPT):
                arguments.extend(getattr(mixer, name).save() for name in DELTA_RULE_INPUTS)
                mixer.set_state_after(t, written)
                following = mixer.state_after(t + 1).save()
                edited = mixer.attention_output.save()
            with self.model.trace(PROMPT) as tracer:
                for _ in tracer.iter[t]:
                    mixer.state = written
                assigned = mixer.attention_output.save()
            assert torch.equal(edited[:, :t], clean[:, :t]), "a state write changed outputs before its token"
            assert not torch.allclose(edited[:, t], clean[:, t]), (
                f"a state write at token {t} left its output unchanged"
            )
            assert torch.equal(assigned, edited), "mix.state = ... at tracer.iter[t] differs from set_state_after(t)"
            step = [value[:, t + 1 : t + 2] for value in arguments]
            expected, _ = reference_delta_rule(*step, initial=written)
            close(
                following,
                expected[:, 0],
                what=f"layers[{layer}]: the token after a write continues from the written state",
            )

    def test_queries_edit_reaches_the_kernel(self) -> None:
        for layer in self.recurrent_layers():
            mixer = self.model.layers[layer].linear_attn
            with self.model.trace(PROMPT):
                mixer.attention_queries = torch.zeros_like(mixer.attention_queries)
                heads_out = mixer.attention_head_outputs.save()
            assert heads_out.abs().max() == 0, "zero queries read nothing from the state"
            with self.model.trace(PROMPT):
                with torch.no_grad():
                    mixer.attention_keys[:, -1] = 0
                decays = mixer.decays.save()
                states = mixer.states.save()
            decay = decays[:, -1].exp()
            decay = decay[..., None] if decay.dim() == 3 else decay[..., None, None]
            close(
                states[:, -1],
                states[:, -2] * decay,
                what=f"layers[{layer}]: a token whose key is zeroed in place only decays the state",
            )

    # -- decode steps ---------------------------------------------------------------------

    def test_decode_steps_continue_from_the_prompt_state(self) -> None:
        for layer in self.recurrent_layers():
            mixer = self.model.layers[layer].linear_attn
            with self.model.trace(PROMPT):
                prompt_states = mixer.states.save()
            entering, stacks, leaving = [], [], []
            with self.model.generate(PROMPT, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False) as tracer:
                for _ in tracer.iter[:STEPS]:
                    state = mixer.state_input
                    entering.append(None if state is None else state.save())
                    stacks.append(mixer.states.save())
                    leaving.append(mixer.state_output.save())
            assert entering[0] is None, "the prompt starts from no state"
            assert torch.equal(stacks[0], prompt_states), "generate's prompt states differ from a trace's"
            for step in range(1, STEPS):
                assert torch.equal(entering[step], leaving[step - 1]), (
                    f"step {step} does not start from step {step - 1}'s state"
                )
                assert stacks[step].shape[1] == 1, "a decode step is one token"
                assert torch.equal(stacks[step][:, 0], leaving[step]), f"step {step}: states[:, 0] is not state_output"

    # -- batches --------------------------------------------------------------------------

    def test_left_padded_batch_gives_each_prompt_its_own_states(self) -> None:
        tokenizer = self.model.tokenizer
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        try:
            for layer in self.recurrent_layers():
                mixer = self.model.layers[layer].linear_attn
                with self.model.trace(list(BATCH)):
                    batched = mixer.states.save()
                for row, prompt in enumerate(BATCH):
                    with self.model.trace(prompt):
                        alone = mixer.states.save()
                    n = alone.shape[1]
                    close(batched[row, -n:], alone[0], what=f"layers[{layer}] states of {prompt!r} in a padded batch")
        finally:
            tokenizer.padding_side = side

    def test_two_invokes_each_read_their_own_call(self) -> None:
        prompts = ("Hello world, there", "Hello world, where")
        for layer in self.recurrent_layers():
            mixer = self.model.layers[layer].linear_attn
            alone = []
            for prompt in prompts:
                with self.model.trace(prompt):
                    alone.append(mixer.states.save())
            together: list = []
            with self.model.trace() as tracer:
                for prompt in prompts:
                    with tracer.invoke(prompt):
                        together.append(mixer.states.save())
            for prompt, single, invoked in zip(prompts, alone, together, strict=True):
                close(invoked, single, what=f"layers[{layer}] states of {prompt!r} in its own invoke")

    # -- kernels, routing and errors ----------------------------------------------------

    def test_default_kernels_serve_the_same_values_and_refuse_states(self) -> None:
        with self.default_kernels():
            chunked = self.build_model()
            layer = self.recurrent_layers()[0]
            mixer = chunked.layers[layer].linear_attn
            reason = chunked.support(layer=layer)["linear_attn.states"]
            assert reason == TOKEN_LOOP.hint, f"unrouted states: support says {reason!r}"
            saved: list = []
            with chunked.trace(PROMPT):
                saved.extend((mixer.attention_head_outputs.save(), mixer.state_output.save()))
            with raises_unavailable(TOKEN_LOOP.hint):
                with chunked.trace(PROMPT):
                    mixer.states.save()
        routed_heads, routed_state = self.read_mixer(layer, "attention_head_outputs", "state_output")
        close(saved[0], routed_heads, atol=1e-4, what="head outputs: chunked vs token-by-token kernel")
        close(saved[1], routed_state, atol=1e-4, what="state_output: chunked vs token-by-token kernel")

    def test_routing_after_a_trace_warns_and_states_say_why(self) -> None:
        family = REGISTRY.family(self.family)
        route_kernels(family, "default")
        try:
            late = self.build_model()
            mixer = late.layers[self.recurrent_layers()[0]].linear_attn
            with late.trace(PROMPT):
                mixer.attention_queries.save()
        finally:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                route_kernels(family, "torch")
        assert any("already traced" in str(warning.message) for warning in caught), "no warning about a traced mixer"
        assert late.support(layer=self.recurrent_layers()[0])["linear_attn.states"] == TRACED_BEFORE_ROUTING
        with raises_unavailable(TRACED_BEFORE_ROUTING):
            with late.trace(PROMPT):
                mixer.states.save()

    def test_routing_back_to_default_after_a_routed_trace_warns(self) -> None:
        """The class's model was traced routed: 'default' leaves it on the token loop, and says so."""
        family = REGISTRY.family(self.family)
        with self.model.trace(PROMPT):
            self.model.layers[self.recurrent_layers()[0]].linear_attn.attention_queries.save()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            route_kernels(family, "default")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            route_kernels(family, "torch")
        messages = [str(warning.message) for warning in caught]
        assert any("'default'" in message and "token-by-token" in message for message in messages), messages

    def test_state_index_outside_the_call_raises(self) -> None:
        seq = self.prompt_length()
        mixer = self.model.layers[self.recurrent_layers()[0]].linear_attn
        for t in (seq, -seq - 1):
            try:
                with self.model.trace(PROMPT):
                    mixer.state_after(t).save()
            except IndexError as error:
                assert f"has {seq} token(s)" in str(error)
            else:
                raise AssertionError(f"state_after({t}) on a {seq}-token prompt did not raise IndexError")

    def test_route_kernels_rejects_bad_arguments_and_leaves_bindings(self) -> None:
        """Bad arguments rebind nothing; 'torch' binds both kernel names to the token loop, 'default' restores the import's.

        Under ``default_kernels``, so the bindings start as transformers made
        them; each is checked against that (each name dispatching to its own
        pure-torch kernel), not against what the class's routing left.
        """
        family = REGISTRY.family(self.family)
        mixer_class = type(self.model.layers[self.recurrent_layers()[0]].linear_attn)
        module_class = next(key for key, value in family.ENVOYS.items() if value is mixer_class)
        modeling = modeling_module(module_class)
        names = [call.function for call in mixer_class.calls()]

        def bindings() -> dict[str, object]:
            return {name: getattr(modeling, name) for name in names}

        def rejects_bad_arguments(where: str) -> None:
            before, stash = bindings(), dict(getattr(modeling, STASH, {}))
            for call, expected in (
                (lambda: route_kernels(family, "fast"), "'torch', 'default'"),
                (lambda: route_kernels("qwen", "torch"), "family module"),
                (lambda: route_delta_rule(family, "torch"), "'recurrent' or 'chunked'"),
            ):
                try:
                    call()
                except ValueError as error:
                    assert expected in str(error), f"{error} does not name {expected}"
                else:
                    raise AssertionError(f"route_kernels accepted a bad argument ({where})")
                assert bindings() == before, f"a refused routing changed the bindings ({where})"
                assert dict(getattr(modeling, STASH, {})) == stash, f"a refused routing changed the stash ({where})"

        with warnings.catch_warnings():
            # the class's model was traced routed and keeps its kernels, as intended
            warnings.filterwarnings("ignore", r"route_kernels.*already traced")
            with self.default_kernels():
                imported = bindings()
                assert [callee(imported[name]).torch_function.__name__ for name in names] == names, (
                    f"unrouted, {modeling.__name__} does not bind each kernel name to its own kernel: {imported}"
                )
                token_loop = callee(imported[names[1]]).torch_function
                assert token_loop is not callee(imported[names[0]]).torch_function
                rejects_bad_arguments("unrouted")
                for how, route, unroute in (
                    ("the family", lambda: route_kernels(family, "torch"), lambda: route_kernels(family, "default")),
                    (
                        "its modeling module",
                        lambda: route_kernels(modeling, "torch"),
                        lambda: route_kernels(modeling, "default"),
                    ),
                    (
                        "route_delta_rule",
                        lambda: route_delta_rule(family, "recurrent"),
                        lambda: route_delta_rule(family, "chunked"),
                    ),
                ):
                    route()
                    assert bindings() == dict.fromkeys(names, token_loop), (
                        f"routing {how} to the token loop left {bindings()}"
                    )
                    rejects_bad_arguments(f"routed by {how}")
                    unroute()
                    assert bindings() == imported, f"unrouting {how} did not restore the import-time kernels"
                    assert not hasattr(modeling, STASH), f"unrouting {how} left the stash"

    def test_attention_block_has_no_linear_attn(self) -> None:
        attention = [i for i in range(self.model.num_layers) if i not in self.recurrent_layers()]
        if not attention:
            raise unittest.SkipTest("every block is a DeltaNet block")
        block = self.model.layers[attention[0]]
        assert getattr(block, "linear_attn", None) is None
        try:
            block.linear_attn
        except MissingMixer as error:
            assert isinstance(error, Unavailable) and "self_attn" in str(error)
        else:
            raise AssertionError("an attention block served a linear_attn")
        assert isinstance(self.model.layers[self.recurrent_layers()[0]].linear_attn, RecurrentMixer)


class Glm5NextVisionSuite(QwenVisionSuite):
    """GLM-5-Next's tower: a Qwen ViT whose blocks take the patch embeddings as they are, then a final norm
    (``tower_output``) and a downsampling convolution before the merger."""

    def downsampled(self, tower: torch.Tensor) -> torch.Tensor:
        """The tower's ``downsample`` convolution over ``tower_output``'s merge blocks: one vector per image token."""
        side = self.model.vision.spatial_merge_size
        blocks = tower[0].reshape(-1, side, side, tower.shape[-1]).permute(0, 3, 1, 2)
        with torch.no_grad():
            return self.model._module.model.visual.downsample(blocks).flatten(1)

    def test_the_merger_folds_the_tower_output_into_the_image_tokens(self) -> None:
        """``tower_output`` is the final norm of the last block's stream; ``downsample`` folds it into the merger's input."""
        vision = self.model.vision
        with self.model.trace(self.encoding()):
            last = vision.layers[-1].layer_output.save()
            tower = vision.tower_output.save()
            entering = self.model.projector.input.save()
            leaving = self.model.projector.output.save()
            features = vision.image_features.save()
        norm = self.model._module.model.visual.post_layernorm
        rms = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight
        close(tower, rms, what="vision.tower_output vs the RMS norm of the last block's output")
        assert features.shape[0] == tower.shape[1] // vision.spatial_merge_size**2 == entering.shape[0]
        close(entering, self.downsampled(tower), what="projector.input vs the downsampled tower_output")
        close(features, leaving, what="image_features vs the merger's output")

    def test_a_tower_output_write_is_what_the_downsampling_takes(self) -> None:
        encoding = self.encoding()
        vision = self.model.vision
        with self.model.trace(encoding):
            clean = vision.tower_output.save()
            features = vision.image_features.save()
        with self.model.trace(encoding):
            vision.tower_output = vision.tower_output * 2
            entering = self.model.projector.input.save()
            written = vision.image_features.save()
        # Doubling the last block's stream instead would leave the norm's output as it is.
        close(entering, self.downsampled(2 * clean), what="projector.input after doubling tower_output")
        assert not torch.allclose(written, features), "the tower_output write never reached image_features"

    def test_patch_embeddings_enter_the_first_block(self) -> None:
        """The positions are rotary, inside the attention: nothing is added to the patch embeddings."""
        with self.model.trace(self.encoding()):
            patches = self.model.vision.patch_embeddings.save()
            entering = self.model.vision.layers[0].layer_input.save()
        close(entering, patches, what="vision.layers[0].layer_input vs patch_embeddings")
