"""Reusable conformance suites: the properties every family's standard values must have.

A family's test file mixes the suites of its modules into one class named
``Test<Family>`` and names the family; a third-party plugin does the same::

    class TestLlama(LayerSuite, AttentionSuite):
        family = "llama"

The model is built once per class (``setup_class``), from the family's tiny
config with random weights. Each check is a property of the model (an
identity, a reference computation from served values, a write and what it
changes), never only that something ran. ``nnterp check`` runs the same
suites without pytest.
"""

from __future__ import annotations

import tempfile
import unittest
from operator import attrgetter
from typing import Any, ClassVar

import torch

from ..analysis.lens import logit_lens
from ..availability import Unavailable
from ..family import declared
from ..order import OrderError
from ..transformer import StandardizedTransformer
from .models import save_tiny, tiny_model, tiny_standardized

PROMPT = "Hello world, there"
#: Prompts of different lengths, for a padded batch.
BATCH = ("Hello world, there", "Hi you")
#: The sublayer contributions of a block, in the order a block's forward makes them unless its family says otherwise.
CONTRIBUTIONS = (("self_attn", "attention_output"), ("linear_attn", "attention_output"), ("mlp", "mlp_output"))
ATOL = 1e-5
#: ``with raises(Error, "pattern"):``, as the suites run without pytest too (``nnterp check``).
raises = unittest.TestCase().assertRaisesRegex


def blocks_with(model: StandardizedTransformer, module: str) -> list[int]:
    """The indices of the blocks that have a child under the standard name ``module``; call it outside a trace."""
    return [i for i, layer in enumerate(model.layers) if getattr(layer, module, None) is not None]


def block_value(model: StandardizedTransformer, layer: int, name: str) -> tuple[Any, str]:
    """The envoy serving block ``layer``'s value ``name``, as ``support(layer=)`` spells it, and the value's attribute.

    ``getattr(*block_value(model, 0, "self_attn.attention_queries"))`` reads
    it inside a trace; ``setattr`` with a third argument writes it.
    """
    owner, _, value = name.rpartition(".")
    block = model.layers[layer]
    return (attrgetter(owner)(block) if owner else block), value


def before_mlp(contributions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (module, value) contributions a block adds before its MLP's: all of them on a block without one.

    Not every contribution but the MLP's: a per-layer input may be added after it (Gemma-4's).
    """
    modules = [module for module, _ in contributions]
    return contributions[: modules.index("mlp")] if "mlp" in modules else contributions


def close(actual: torch.Tensor, expected: torch.Tensor, atol: float = ATOL, what: str = "") -> None:
    """Assert two tensors are equal up to ``atol``, naming ``what`` and the largest difference."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    difference = (actual.float() - expected.float()).abs().max().item()
    assert difference <= atol, f"{what}: differs by {difference:.3g} (tolerance {atol})"


class Suite:
    """What every suite shares: the family under test, and its model built once per class."""

    family: ClassVar[str]
    load: ClassVar[dict[str, Any]] = {}
    model: ClassVar[StandardizedTransformer]
    #: Whether ``nnterp check`` runs it on a family whose model it applies to; a suite of nnterp's own machinery
    #: (``ForwardChangeSuite``, which rewrites a forward) runs under pytest only.
    conformance: ClassVar[bool] = True

    @classmethod
    def build_model(cls) -> StandardizedTransformer:
        return tiny_standardized(cls.family, **cls.load)

    @classmethod
    def setup_class(cls) -> None:
        cls.model = cls.build_model()

    @classmethod
    def save_model(cls, directory: str) -> None:
        """Save a tiny model of the family, with what it loads with, to ``directory``."""
        save_tiny(cls.family, directory, **cls.load)

    @classmethod
    def load_saved(cls, directory: str) -> StandardizedTransformer:
        """Load what ``save_model`` saved, by path, as a user would."""
        return StandardizedTransformer(directory, **cls.load)

    @classmethod
    def same_model(cls, loaded: StandardizedTransformer) -> StandardizedTransformer:
        """The model ``save_model`` saved, built again in memory and loaded with ``loaded``'s preprocessor."""
        return StandardizedTransformer(tiny_model(cls.family, **cls.load), tokenizer=loaded.tokenizer)


class LayerSuite(Suite):
    """The residual stream through every block: contributions add up, and writes reach the next block."""

    def contributions(self, layer: int) -> list[tuple[str, str]]:
        """The (module, value) contributions block ``layer`` has, in the order its forward makes them.

        The family's ``CONTRIBUTIONS`` where its blocks run their sublayers in
        another order (Falcon-H1's mixer before its attention), else
        attention, recurrent mixer, MLP.
        """
        block = self.model.layers[layer]
        order = declared(self.model.family).CONTRIBUTIONS or CONTRIBUTIONS
        return [(module, value) for module, value in order if getattr(block, module, None) is not None]

    def test_the_class_runs_the_suites_nnterp_check_runs(self) -> None:
        """A family's test class runs the suites ``nnterp check`` gives its model, and no unrelated one.

        ``suite_for`` decides them. A suite that extends a checked one may stand for it (DOGE's scores carry a
        bias: ``AlibiAttentionSuite`` for ``AttentionSuite``). A class with ``load`` tests a configuration
        ``nnterp check`` never builds, and chooses its suites itself.
        """
        from .assembly import suite_for

        if self.load:
            raise unittest.SkipTest("a variant configuration: nnterp check builds the family's default one")
        checked = suite_for(self.model.family).__bases__
        # a suite is what a testing kit publishes (nnterp.testing, a plugin's .testing), whether registered or not
        here = [
            suite
            for suite in type(self).__mro__
            if issubclass(suite, Suite) and suite is not Suite and ".testing" in suite.__module__ and suite.conformance
        ]
        missing = [suite.__name__ for suite in checked if not issubclass(type(self), suite)]
        more = [
            suite.__name__
            for suite in here
            if not any(issubclass(other, suite) or issubclass(suite, other) for other in checked)
        ]
        assert not missing and not more, (
            f"{type(self).__name__} runs suites other than `nnterp check`'s for its model (suite_for): add {missing}, "
            f"drop {more}"
        )

    def test_contributions_add_up_to_layer_output(self) -> None:
        model = self.model
        plan = [self.contributions(i) for i in range(model.num_layers)]
        inputs, parts, outputs = [], [], []
        with model.trace(PROMPT):
            for i, layer in enumerate(model.layers):
                inputs.append(layer.layer_input.save())
                parts.append([getattr(getattr(layer, module), value).save() for module, value in plan[i]])
                outputs.append(layer.layer_output.save())
        for i in range(model.num_layers):
            assert plan[i], f"block {i} has no sublayer contribution"
            total = self.stream_after(i, inputs[i], parts[i])
            close(total, outputs[i], what=f"layers[{i}]: layer_input + {plan[i]} vs layer_output")

    def stream_after(
        self, layer: int, entering: torch.Tensor, parts: list[torch.Tensor], first: int = 0
    ) -> torch.Tensor:
        """The residual stream after adding ``parts`` to ``entering`` in order, as the block adds each
        (``Layer.stream_after_adding``).

        ``parts`` are the block's contributions from its ``first`` on (the MLP's alone, from ``layer_mid``).
        """
        block = self.model.layers[layer]
        stream = entering
        for index, part in enumerate(parts, start=first):
            stream = block.stream_after_adding(index, stream, part)
        return stream

    def test_layer_mid_is_input_plus_the_sequence_mixers(self) -> None:
        model = self.model
        unavailable = model.support()["layer_mid"] or {}
        blocks = [i for i in range(model.num_layers) if i not in unavailable]
        if not blocks:
            raise unittest.SkipTest(f"no block has a stream between its sublayers: {unavailable}")
        mixers = {i: before_mlp(self.contributions(i)) for i in blocks}
        saved = {}
        with model.trace(PROMPT):
            for i in blocks:
                layer = model.layers[i]
                entering = layer.layer_input.save()
                parts = [getattr(getattr(layer, module), value).save() for module, value in mixers[i]]
                saved[i] = (entering, parts, layer.layer_mid.save())
        for i, (entering, parts, mid) in saved.items():
            close(
                self.stream_after(i, entering, parts), mid, what=f"layers[{i}]: layer_input + {mixers[i]} vs layer_mid"
            )

    def test_assigned_layer_mid_reaches_the_mlp_and_the_residual_it_is_added_to(self) -> None:
        """A pre-norm block holds the stream between its sublayers twice: the MLP norm's input and the residual."""
        model = self.model
        unavailable = model.support()["layer_mid"] or {}
        blocks = [i for i in range(model.num_layers) if i not in unavailable]
        if not blocks:
            raise unittest.SkipTest(f"no block has a stream between its sublayers: {unavailable}")
        i = blocks[0]
        mixers = before_mlp(self.contributions(i))
        after = self.contributions(i)[len(mixers) :]
        layer = model.layers[i]
        parts: list[torch.Tensor] = []  # bound outside: a name first bound inside a trace does not survive it
        with model.trace(PROMPT):
            written = (torch.randn_like(layer.layer_mid) * layer.layer_mid.std()).save()
            layer.layer_mid = written
            parts.extend(getattr(getattr(layer, module), value).save() for module, value in after)
            leaving = layer.layer_output.save()
        close(
            self.stream_after(i, written, parts, first=len(mixers)),
            leaving,
            what=f"layers[{i}].layer_output after assigning layer_mid: the written stream + {after}",
        )

    def test_assigned_layer_output_is_next_layer_input(self) -> None:
        model = self.model
        with model.trace(PROMPT):
            clean = model.logits.save()
        with model.trace(PROMPT):
            written = torch.zeros_like(model.layers[0].layer_output) + 0.5
            model.layers[0].layer_output = written
            received = model.layers[1].layer_input.save()
            edited = model.logits.save()
        close(
            received,
            torch.full_like(received, 0.5),
            what="layers[1].layer_input after assigning layers[0].layer_output",
        )
        assert not torch.allclose(clean, edited), "assigning layers[0].layer_output left the logits unchanged"

    def test_in_place_edit_of_layer_output_reaches_next_layer(self) -> None:
        model = self.model
        with model.trace(PROMPT):
            model.layers[0].layer_output[:, -1] = 0
            received = model.layers[1].layer_input.save()
        assert torch.count_nonzero(received[:, -1]) == 0, "an in-place edit of layer_output did not reach layers[1]"
        assert torch.count_nonzero(received[:, 0]) > 0

    def test_skipped_block_passes_its_input_on(self) -> None:
        model = self.model
        with model.trace(PROMPT):
            entering = model.layers[0].layer_input.save()
            model.layers[0].skip(entering)
            received = model.layers[1].layer_input.save()
        close(received, entering, what="layers[1].layer_input after skipping layers[0]")

    def test_a_value_asked_for_after_the_forward_produced_it_raises_at_once(self) -> None:
        """layer_output then layer_input of one block: OrderError naming layer_input, before the model runs on.

        On a prompt, and on a decode step where the first read of the step
        relaxes nnsight's pin (the next input would be the next step's).
        """
        model = self.model
        head_calls = []
        hook = model._module.get_output_embeddings().register_forward_hook(lambda *_: head_calls.append(1))
        try:
            for decode in (False, True):
                head_calls.clear()
                saved: list[torch.Tensor] = []
                try:
                    if decode:
                        with model.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
                            for _ in tracer.iter[1:3]:
                                saved.append(model.layers[0].layer_output.save())
                                saved.append(model.layers[0].layer_input.save())
                    else:
                        with model.trace(PROMPT):
                            saved.append(model.layers[0].layer_output.save())
                            saved.append(model.layers[0].layer_input.save())
                except OrderError as error:
                    assert "layer_input on layers[0]" in str(error), str(error)
                    assert "in turn" in str(error), f"the error does not give the forward's order: {error}"
                else:
                    raise AssertionError(f"layer_input after layer_output was served ({len(saved)} saves)")
                assert len(head_calls) == int(decode), f"the error came after the forward ran on ({len(head_calls)})"
        finally:
            hook.remove()

    def test_logits_and_next_token_probs(self) -> None:
        model = self.model
        with model.trace(PROMPT):
            logits = model.logits.save()
            probs = model.next_token_probs.save()
        seq = len(model.tokenizer(PROMPT).input_ids)
        assert tuple(logits.shape) == (1, seq, model.vocab_size)
        with torch.no_grad():
            plain = model._module(**model.tokenizer(PROMPT, return_tensors="pt")).logits
        close(logits, plain, what="logits vs the model's own output (after any scaling or soft-capping of the head)")
        close(probs, torch.softmax(logits[:, -1].float(), dim=-1), what="next_token_probs")
        close(probs.sum(-1), torch.ones(1), atol=1e-4, what="next_token_probs row sums")

    def test_logit_lens_of_the_last_block_is_the_logits(self) -> None:
        """The model's head on the last block's output is the logits: final norm, unembedding, scaling, soft-capping.

        ``nnterp.analysis.lens.logit_lens`` reads what follows the blocks off the
        model; a head it cannot apply exactly raises ``Unavailable``, and
        the check is skipped with the reason.
        """
        model = self.model
        # A random model's norms start as the identity, and normalizing a normalized stream again changes nothing:
        # give every norm weights of its own, so that applying the wrong norm, or a missing one, shows.
        norms = [m for m in model._module.modules() if "norm" in type(m).__name__.lower()]
        saved = {p: p.detach().clone() for m in norms for p in m.parameters(recurse=False) if p.is_floating_point()}
        generator = torch.Generator().manual_seed(0)
        try:
            with torch.no_grad():
                for parameter in saved:
                    noise = torch.rand(parameter.shape, generator=generator) + 0.5
                    parameter.mul_(noise.to(parameter)).add_((noise - 1).to(parameter))
            with model.trace(PROMPT):
                lens = logit_lens(model, layers=-1).save()
                logits = model.logits.save()
        except Unavailable as error:
            raise unittest.SkipTest(f"the model's head cannot be applied to a stream: {error}") from error
        finally:
            with torch.no_grad():
                for parameter, value in saved.items():
                    parameter.copy_(value)
        close(lens, logits.float(), what="logit_lens of the last block vs logits (every norm's weights perturbed)")

    def test_a_logits_write_decides_the_generated_token(self) -> None:
        """Logits are where generation samples from: favouring one token there makes greedy decoding pick it.

        On the middle of three steps, as a model's generation config may force the first or the last token
        (BART's forced EOS at the maximum length).
        """
        model = self.model
        chosen = 7
        with model.generate(PROMPT, max_new_tokens=3, min_new_tokens=3, do_sample=False) as tracer:
            for _ in tracer.iter[1]:
                favoured = model.logits.clone()
                favoured[:, -1, chosen] = favoured[:, -1].max() + 100
                model.logits = favoured
            generated = tracer.result.save()
        assert generated[0, -2].item() == chosen, f"generated {generated[0, -2].item()} after favouring {chosen}"

    def test_unavailable_values_raise_what_support_reports(self) -> None:
        model = self.model
        for layer in range(model.num_layers):
            block = model.layers[layer]
            for name, reason in model.support(layer=layer).items():
                owner, _, value = name.rpartition(".")
                if reason is None or (owner and getattr(block, owner, None) is None):
                    continue
                envoy = getattr(block, owner) if owner else block
                if value not in type(envoy).values():
                    # Another kind of module than the blocks that have the value: it has no such attribute at all.
                    assert type(envoy).__name__ in reason, f"{name}: support says {reason!r}"
                    with raises(AttributeError, value):
                        getattr(envoy, value)
                    continue
                try:
                    with model.trace(PROMPT):
                        getattr(envoy, value).save()
                except Unavailable as error:
                    assert reason in str(error), f"{name}: raised {error!r}, support says {reason!r}"
                else:
                    raise AssertionError(f"layers[{layer}].{name} is reported unavailable ({reason}) but was read")

    def test_saved_model_loads_by_path(self) -> None:
        with tempfile.TemporaryDirectory() as directory:
            self.save_model(directory)
            loaded = self.load_saved(directory)
            assert loaded.family is self.model.family
            reference = self.same_model(loaded)
            with loaded.trace(PROMPT):
                from_disk = loaded.logits.save()
            with reference.trace(PROMPT):
                in_memory = reference.logits.save()
        close(from_disk, in_memory, what="logits of the model loaded by path")


def mixed_streams(
    streams: torch.Tensor, weights: torch.Tensor, mixing: torch.Tensor | None, output: torch.Tensor
) -> torch.Tensor:
    """The streams after a sublayer on a hyper-connection block: ``mixing^T @ streams + weights * output``, per token.

    ``mixing`` is ``None`` where the block carries the streams on unmixed.
    """
    carried = streams if mixing is None else mixing.to(streams.dtype).transpose(-1, -2) @ streams
    return carried + weights.to(streams.dtype).unsqueeze(-1) * output.unsqueeze(-2)


class HyperConnectionSuite(LayerSuite):
    """The residual streams through every ``HyperConnectionLayer``: the hyper-connections' reads, weights and mixing.

    The layer suite's identities hold with the streams weighted (and mixed)
    at each sublayer (``stream_after``), recomputed through the block's own
    hyper-connection modules; the served weights and mixing are checked
    against what the block did with them, and a write to each against the
    streams after it.
    """

    #: Each sublayer's hyper-connection module on the block, in the forward's order.
    HYPER_CONNECTIONS = ("attn_hc", "ffn_hc")

    @classmethod
    def build_model(cls) -> StandardizedTransformer:
        # Fresh hyper-connections weight every stream about alike, which would hide a weight or a mixing applied to the
        # wrong stream: a checkpoint's biases (``base``) tell the streams apart, so draw some.
        model = super().build_model()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for block in model._module.modules():
                for name in cls.HYPER_CONNECTIONS:
                    connection = getattr(block, name, None)
                    if isinstance(connection, torch.nn.Module):
                        connection.base.copy_(torch.randn(connection.base.shape, generator=generator))
        return model

    def mixes(self, layer: int) -> bool:
        return "mixing" in self.model.layers[layer].HYPER_CONNECTION

    def stream_after(
        self, layer: int, entering: torch.Tensor, parts: list[torch.Tensor], first: int = 0
    ) -> torch.Tensor:
        block = self.model.layers[layer]
        stream = entering
        for part, name in zip(parts, self.HYPER_CONNECTIONS[first:], strict=False):
            with torch.no_grad():
                returned = dict(zip(block.HYPER_CONNECTION, getattr(block._module, name)(stream), strict=True))
            stream = mixed_streams(stream, returned["weights"], returned.get("mixing"), part)
        return stream

    def read_streams(self, layer: int) -> dict[str, torch.Tensor]:
        """Every stream value of block ``layer`` and its sublayers' outputs, in the forward's order."""
        block = self.model.layers[layer]
        mixer = "linear_attn" if getattr(block, "linear_attn", None) is not None else "self_attn"
        read: dict[str, torch.Tensor] = {}
        with self.model.trace(PROMPT):
            read["layer_input"] = block.layer_input.save()
            for sublayer, module in (("attention", getattr(block, mixer)), ("mlp", block.mlp)):
                if sublayer == "mlp":
                    read["layer_mid"] = block.layer_mid.save()
                for returned in block.HYPER_CONNECTION:
                    read[f"{sublayer}_stream_{returned}"] = getattr(block, f"{sublayer}_stream_{returned}").save()
                read[f"{sublayer}_norm_output"] = getattr(block, f"{sublayer}_norm_output").save()
                read[f"{sublayer}_output"] = getattr(module, f"{sublayer}_output").save()
            read["layer_output"] = block.layer_output.save()
        return read

    def test_streams_are_weighted_and_mixed_as_served(self) -> None:
        for layer in range(self.model.num_layers):
            read = self.read_streams(layer)
            streams = self.model.layers[layer].streams
            assert read["layer_input"].shape[-2] == streams == read["attention_stream_weights"].shape[-1]
            for sublayer, before, after in (
                ("attention", "layer_input", "layer_mid"),
                ("mlp", "layer_mid", "layer_output"),
            ):
                mixing = read.get(f"{sublayer}_stream_mixing")
                if mixing is not None:
                    # Sinkhorn's last step normalizes what each output stream takes; its rows are only near 1.
                    columns = mixing.sum(-2)
                    close(columns, torch.ones_like(columns), what=f"layers[{layer}]: {sublayer} mixing columns")
                weights = read[f"{sublayer}_stream_weights"]
                expected = mixed_streams(read[before], weights, mixing, read[f"{sublayer}_output"])
                close(read[after], expected, what=f"layers[{layer}]: {after} vs mixing^T {before} + weights * output")
            norms = self.model.layers[layer]._module
            with torch.no_grad():
                for sublayer, norm in (("attention", norms.input_layernorm), ("mlp", norms.post_attention_layernorm)):
                    expected = norm(read[f"{sublayer}_stream_read"])
                    close(
                        read[f"{sublayer}_norm_output"], expected, what=f"layers[{layer}]: norm of the {sublayer} read"
                    )

    def test_written_weights_and_mixing_reach_the_streams(self) -> None:
        """Zero weights leave only the carried streams; the identity mixing carries each stream as it is."""
        block = self.model.layers[0]
        mixes = self.mixes(0)
        with self.model.trace(PROMPT):
            clean = self.model.logits.save()
        with self.model.trace(PROMPT):
            entering = block.layer_input.save()
            block.attention_stream_weights[:] = 0
            if mixes:
                mixing = block.attention_stream_mixing.save()
            mid = block.layer_mid.save()
            weighted_out = self.model.logits.save()
        carried = mixing.transpose(-1, -2) @ entering if mixes else entering
        close(mid, carried, what="layer_mid with the attention's stream weights zeroed")
        assert not torch.allclose(clean, weighted_out), (
            "zeroing the attention's stream weights left the logits as they were"
        )
        if not mixes:
            with raises(Unavailable, "unmixed"):
                with self.model.trace(PROMPT):
                    block.attention_stream_mixing.save()
            return
        with self.model.trace(PROMPT):
            mid = block.layer_mid.save()
            block.mlp_stream_mixing = torch.eye(block.streams).expand_as(block.mlp_stream_mixing).clone()
            weights = block.mlp_stream_weights.save()
            output = block.mlp.mlp_output.save()
            leaving = block.layer_output.save()
        close(leaving, mid + weights.unsqueeze(-1) * output.unsqueeze(-2), what="layer_output with identity mixing")


def moved_scores(scores: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """Which scores differ from ``clean``'s, each row taken less its first key's score.

    A family may shift a row by a constant, which the softmax ignores (MiMo-V2-Flash's less its maximum).
    """
    centered = (scores - scores[..., :1]).float(), (clean - clean[..., :1]).float()
    return ~torch.isclose(*centered, atol=1e-4, rtol=1e-4, equal_nan=True)


class AttentionSuite(Suite):
    """Softmax attention, read inside the eager interface: the pattern, its inputs and its outputs agree."""

    def attention_blocks(self) -> list[int]:
        support = self.model.support()
        missing = support.get("self_attn.attention_probabilities") or {}
        blocks = [i for i in blocks_with(self.model, "self_attn") if i not in missing]
        if not blocks:
            raise unittest.SkipTest(f"no block serves the attention interior: {missing or 'no self_attn module'}")
        return blocks

    def read(self, layer: int, *names: str) -> list[torch.Tensor]:
        attention = self.model.layers[layer].self_attn
        saved: list[torch.Tensor] = []  # bound outside: a name first bound inside a trace does not survive it
        with self.model.trace(PROMPT):
            saved.extend(getattr(attention, name).save() for name in names)
        return saved

    def test_sizes_match_served_shapes(self) -> None:
        # the positions the blocks run on: the prompt's tokens, after any the model puts before them (CPM-Ant's)
        prefix = declared(self.model.family).prefix_positions
        seq = len(self.model.tokenizer(PROMPT).input_ids) + (prefix(self.model._module.config) if prefix else 0)
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            queries, keys, values, pattern, heads = self.read(
                layer,
                "attention_queries",
                "attention_keys",
                "attention_values",
                "attention_probabilities",
                "attention_head_outputs",
            )
            assert tuple(queries.shape) == (1, attention.num_heads, seq, attention.qk_head_dim)
            assert tuple(keys.shape) == (1, attention.num_kv_heads, seq, attention.qk_head_dim)
            assert tuple(values.shape) == (1, attention.num_kv_heads, seq, attention.head_dim)
            assert tuple(pattern.shape) == (1, attention.num_heads, seq, seq)
            assert tuple(heads.shape) == (1, seq, attention.num_heads, attention.head_dim)

    def skip_unless_causal(self) -> None:
        """Skip a test of the causal mask where the family says the installed transformers masks both ways."""
        if declared(self.model.family).ATTENDS_BOTH_WAYS:
            raise unittest.SkipTest("this transformers masks the model bidirectionally despite is_decoder")

    def test_pattern_is_softmax_of_scores(self) -> None:
        self.skip_unless_causal()
        for layer in self.attention_blocks():
            scores, pattern = self.read(layer, "attention_scores", "attention_probabilities")
            close(torch.softmax(scores.float(), dim=-1), pattern, what=f"layers[{layer}] softmax(scores) vs pattern")
            close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)), atol=1e-4, what="pattern row sums")
            future = torch.triu(torch.ones(pattern.shape[-2:], dtype=torch.bool), diagonal=1)
            assert pattern[..., future].abs().max() == 0, "a query attends to a later key"

    def test_head_outputs_mix_values_with_pattern(self) -> None:
        for layer in self.attention_blocks():
            values, pattern, heads = self.read(
                layer, "attention_values", "attention_probabilities", "attention_head_outputs"
            )
            repeated = values.repeat_interleave(pattern.shape[1] // values.shape[1], dim=1)
            expected = (pattern @ repeated).transpose(1, 2)
            close(heads, expected, what=f"layers[{layer}] head outputs vs pattern @ values")

    def test_token_mixing_is_the_pattern_at_the_asked_rows_and_heads(self) -> None:
        layer = self.attention_blocks()[0]
        attention = self.model.layers[layer].self_attn
        selections = ({}, {"positions": [-1, 0]}, {"positions": 2, "heads": -1}, {"heads": slice(1, None)})
        read: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            pattern = attention.attention_probabilities.save()
            read.extend(attention.token_mixing(**chosen).save() for chosen in selections)
        expected = (pattern, pattern[:, :, [-1, 0]], pattern[:, -1, 2], pattern[:, 1:])
        for chosen, matrix, want in zip(selections, read, expected, strict=True):
            assert torch.equal(matrix, want), f"token_mixing({chosen}) is not the pattern's selection"

    def test_zero_queries_give_uniform_causal_pattern(self) -> None:
        self.skip_unless_causal()
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            with self.model.trace(PROMPT):
                attention.attention_queries = torch.zeros_like(attention.attention_queries)
                pattern = attention.attention_probabilities.save()
            seq = pattern.shape[-1]
            causal = torch.tril(torch.ones(seq, seq))
            expected = (causal / causal.sum(-1, keepdim=True)).expand_as(pattern)
            close(pattern, expected, what=f"layers[{layer}] pattern under zero queries")

    def test_a_query_write_moves_its_score_row_and_a_key_write_its_column(self) -> None:
        """Queries and keys are what the scores are made of, each in its place: query i is score row i, key j column j."""
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            (clean,) = self.read(layer, "attention_scores")
            position = clean.shape[-1] // 2
            changed = {}
            for name in ("attention_queries", "attention_keys"):
                with self.model.trace(PROMPT):
                    written = getattr(attention, name).clone()
                    written[:, :, position] = written[:, :, position] * 3 + 1
                    setattr(attention, name, written)
                    changed[name] = attention.attention_scores.save()
            rows = moved_scores(changed["attention_queries"], clean).any(-1).flatten(0, 1).any(0)
            assert rows.nonzero().flatten().tolist() == [position], f"layers[{layer}]: a query write moved rows {rows}"
            columns = moved_scores(changed["attention_keys"], clean).any(-2).flatten(0, 1).any(0)
            assert columns.nonzero().flatten().tolist() == [position], f"layers[{layer}]: a key write moved {columns}"

    def test_pattern_edit_changes_only_its_query(self) -> None:
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            with self.model.trace(PROMPT):
                clean = attention.attention_output.save()
            with self.model.trace(PROMPT):
                attention.attention_probabilities[:, :, -1] = 0
                edited = attention.attention_output.save()
            close(edited[:, :-1], clean[:, :-1], what=f"layers[{layer}] outputs before the edited query")
            assert not torch.allclose(edited[:, -1], clean[:, -1]), "zeroing the last query's pattern changed nothing"
