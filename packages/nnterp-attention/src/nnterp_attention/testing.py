"""Conformance suites for the attentions this plugin adds beyond ``nnterp.testing``'s."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from nnterp import StandardizedTransformer, Unavailable
from nnterp.testing import PROMPT, AttentionSuite, LayerSuite, close
from nnterp.testing.suites import raises
from nnterp.testing.vision import VisionSuite, tiny_vision_model

from .families.gemma3n_text import streams_stacked, streams_view


def causal_softmax(bias: torch.Tensor) -> torch.Tensor:
    """The pattern a bias that depends on the key alone gives, [..., seq, seq]: its softmax over each query's causal keys.

    ``bias`` is [..., 1, seq] (one row, every key), as ALiBi's is.
    """
    seq = bias.shape[-1]
    future = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=bias.device), diagonal=1)
    return torch.softmax(bias.float().expand(*bias.shape[:-2], seq, seq).masked_fill(future, float("-inf")), dim=-1)


class AlibiAttentionSuite(AttentionSuite):
    """Softmax attention under an ALiBi bias (BLOOM, MPT): ``AttentionSuite``, with zero queries leaving the bias."""

    def test_zero_queries_give_uniform_causal_pattern(self) -> None:
        """Zero queries (or keys) leave the scores to the bias, which depends on the key alone, not a uniform pattern.

        So every query's pattern is the softmax of the last query's scores over its own causal keys.
        """
        self.skip_unless_causal()
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            for name in ("attention_queries", "attention_keys"):
                with self.model.trace(PROMPT):
                    setattr(attention, name, torch.zeros_like(getattr(attention, name)))
                    scores = attention.attention_scores.save()
                    pattern = attention.attention_probabilities.save()
                close(pattern, causal_softmax(scores[..., -1:, :]), what=f"layers[{layer}] pattern under zero {name}")

    def test_head_outputs_take_in_place_edits_and_assignment(self) -> None:
        """Zeroing the last position's head outputs, in place or by assignment, gives that position what zero heads give.

        Zero heads give the output projection's bias (or nothing), wherever the projection sits (BERT's is outside
        the attention module): read off a run with every head output zeroed.
        """
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            clean = attention.attention_output.save()
        with self.model.trace(PROMPT):
            attention.attention_head_outputs = torch.zeros_like(attention.attention_head_outputs)
            silent = attention.attention_output.save()
        with self.model.trace(PROMPT):
            attention.attention_head_outputs[:, -1] = 0
            edited = attention.attention_output.save()
        with self.model.trace(PROMPT):
            zeroed = attention.attention_head_outputs.clone()
            zeroed[:, -1] = 0
            attention.attention_head_outputs = zeroed
            assigned = attention.attention_output.save()
        assert not torch.allclose(clean[:, -1], silent[:, -1]), "zeroing every head output left attention_output as is"
        close(edited[:, :-1], clean[:, :-1], what="outputs before the edited position")
        close(edited[:, -1], silent[:, -1], what="the edited position's output: what zero head outputs give")
        close(assigned, edited, what="assigned vs in-place zeroed head outputs")


def sink_softmax(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """``softmax(cat([scores, sink]))`` of each row, [batch, heads, query, key + 1], in float32: the last column is the sink's.

    ``scores`` is [batch, heads, query, key] and ``sinks`` one logit per head.
    """
    column = sinks.detach().float().reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores.float(), column], dim=-1), dim=-1)


class SinkAttentionSuite(AttentionSuite):
    """Softmax attention with a sink per head (GPT-OSS): ``AttentionSuite``, with each row's mass shared with its sink."""

    def test_pattern_is_softmax_of_scores(self) -> None:
        """The pattern is the softmax of the scores and the head's sink, less the sink's column: rows sum below one."""
        for layer in self.attention_blocks():
            sinks = self.model.layers[layer].self_attn.sink_logits
            scores, pattern = self.read(layer, "attention_scores", "attention_probabilities")
            full = sink_softmax(scores, sinks)
            close(pattern, full[..., :-1], what=f"layers[{layer}] softmax(cat(scores, sinks))[..., :-1] vs pattern")
            close(pattern.sum(-1), 1 - full[..., -1], atol=1e-4, what=f"layers[{layer}] pattern row sums")
            if torch.isfinite(sinks).all():
                assert (pattern.sum(-1) < 1).all(), f"layers[{layer}]: a row gave its sink nothing"
            future = torch.triu(torch.ones(pattern.shape[-2:], dtype=torch.bool), diagonal=1)
            assert pattern[..., future].abs().max() == 0, "a query attends to a later key"

    def test_zero_queries_give_uniform_causal_pattern(self) -> None:
        """Zero queries give each causal key the same share, ``1 / (keys + exp(sink))``; the sink takes the rest."""
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            sinks = attention.sink_logits.detach().float()
            with self.model.trace(PROMPT):
                attention.attention_queries = torch.zeros_like(attention.attention_queries)
                pattern = attention.attention_probabilities.save()
            seq = pattern.shape[-1]
            causal = torch.tril(torch.ones(seq, seq))
            expected = causal / (causal.sum(-1, keepdim=True) + sinks.exp().view(-1, 1, 1))
            close(pattern, expected.expand_as(pattern), what=f"layers[{layer}] pattern under zero queries")

    def test_a_scores_write_reaches_the_pattern(self) -> None:
        """Raising one score, by assignment or in place, gives the pattern of the written scores and the sinks."""
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            sinks = attention.sink_logits
            with self.model.trace(PROMPT):
                clean = attention.attention_probabilities.save()
            with self.model.trace(PROMPT):
                written = attention.attention_scores.clone()
                written[:, :, -1, 0] += 3
                attention.attention_scores = written
                written = written.save()
                assigned = attention.attention_probabilities.save()
            with self.model.trace(PROMPT):
                attention.attention_scores[:, :, -1, 0] += 3
                edited = attention.attention_probabilities.save()
            close(assigned, sink_softmax(written, sinks)[..., :-1], what=f"layers[{layer}] pattern of written scores")
            close(edited, assigned, what=f"layers[{layer}] in-place edited vs assigned scores")
            close(assigned[:, :, :-1], clean[:, :, :-1], what=f"layers[{layer}] queries before the written one")
            assert assigned[:, :, -1, 0].gt(clean[:, :, -1, 0]).all(), "raising a score did not raise its probability"

    def test_a_pattern_write_gives_the_head_outputs(self) -> None:
        """An assigned pattern is what the values are mixed with: the head outputs become ``written @ values``."""
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            with self.model.trace(PROMPT):
                clean = attention.attention_head_outputs.save()
            with self.model.trace(PROMPT):
                values = attention.attention_values.save()
                pattern = attention.attention_probabilities
                seq = pattern.shape[-1]
                causal = torch.tril(torch.ones(seq, seq, dtype=pattern.dtype))
                written = (causal / causal.sum(-1, keepdim=True)).expand_as(pattern).clone().save()
                attention.attention_probabilities = written
                heads = attention.attention_head_outputs.save()
            repeated = values.repeat_interleave(written.shape[1] // values.shape[1], dim=1)
            close(
                heads, (written @ repeated).transpose(1, 2), what=f"layers[{layer}] head outputs of the written pattern"
            )
            assert not torch.allclose(heads, clean), f"layers[{layer}]: writing the pattern left the head outputs"


def attend(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Softmax attention without a mask, [1, heads, seq, head_dim] in, [1, seq, heads, head_dim] out."""
    pattern = torch.softmax(queries @ keys.transpose(-1, -2) * queries.shape[-1] ** -0.5, dim=-1)
    return (pattern @ values).transpose(1, 2)


class QwenVisionSuite(VisionSuite):
    """The Qwen ViT: every image's patches in one row, each image attended on its own, a merger as the projector."""

    #: Two images of different grids: 6 x 8 and 4 x 6 patches, at patches of 14 or 16 pixels.
    SIZES = ((84, 112), (56, 84))
    #: A block that attends over whole images (Qwen2.5-VL's other blocks attend over windows).
    FULL_ATTENTION_BLOCK: ClassVar[int] = 0

    def test_each_image_is_attended_on_its_own(self) -> None:
        encoding = self.encoding()
        attention = self.model.vision.layers[self.FULL_ATTENTION_BLOCK].self_attn
        with self.model.trace(encoding):
            queries = attention.attention_queries.save()
            keys = attention.attention_keys.save()
            values = attention.attention_values.save()
            heads = attention.attention_head_outputs.save()
        sizes = self.model.vision.patches_per_image(encoding)
        assert queries.shape == (1, attention.num_heads, sum(sizes), attention.head_dim)
        assert heads.shape == (1, sum(sizes), attention.num_heads, attention.head_dim)
        pieces = zip(*(tensor.split(sizes, dim=2) for tensor in (queries, keys, values)), strict=True)
        expected = torch.cat([attend(*piece) for piece in pieces], dim=1)
        close(heads, expected, what="head outputs vs each image's softmax(q k^T * scale) v")
        assert not torch.allclose(heads, attend(queries, keys, values), atol=1e-4), "the images attend to each other"

    def test_a_value_write_on_one_image_leaves_the_others(self) -> None:
        encoding = self.encoding()
        attention = self.model.vision.layers[self.FULL_ATTENTION_BLOCK].self_attn
        first, second = self.model.vision.patches_per_image(encoding)
        with self.model.trace(encoding):
            clean = attention.attention_head_outputs.save()
        with self.model.trace(encoding):
            values = attention.attention_values
            attention.attention_values = torch.cat([values[:, :, :first], torch.zeros_like(values[:, :, first:])], 2)
            written = attention.attention_head_outputs.save()
        assert written.shape[1] == first + second
        close(written[:, :first], clean[:, :first], what="the first image's head outputs")
        assert torch.all(written[:, first:] == 0), "the second image's zero values left its head outputs nonzero"

    def test_the_interior_is_read_under_sdpa_too(self) -> None:
        """The module splits per image under every implementation but flash, so its values do not need eager."""
        encoding = self.encoding()
        read: list[torch.Tensor] = []
        for implementation in ("eager", "sdpa"):
            model = StandardizedTransformer(
                tiny_vision_model(self.family, attn_implementation=implementation), processor=self.model.processor
            )
            attention = model.vision.layers[self.FULL_ATTENTION_BLOCK].self_attn
            with model.trace(encoding):
                read.append(attention.attention_queries.save())
                read.append(attention.attention_head_outputs.save())
        close(read[2], read[0], what="queries under sdpa vs eager")
        close(read[3], read[1], what="head outputs under sdpa vs eager")

    def test_no_pattern_and_no_image_size(self) -> None:
        with raises(Unavailable, "cu_seqlens"):
            self.model.vision.layers[0].self_attn.attention_probabilities
        with raises(Unavailable, "any resolution"):
            self.model.vision.image_size

    def test_sizes_are_the_served_widths(self) -> None:
        vision = self.model.vision
        with self.model.trace(self.encoding()):
            patches = vision.patch_embeddings.save()
            queries = vision.layers[0].self_attn.attention_queries.save()
            neurons = vision.layers[0].mlp.mlp_neurons.save()
        assert patches.shape[-1] == vision.vision_hidden_size
        assert neurons.shape[-1] == vision.intermediate_size
        assert queries.shape[1] == vision.num_heads and queries.shape[-1] == vision.head_dim

    def test_the_merger_folds_the_tower_output_into_the_image_tokens(self) -> None:
        encoding = self.encoding()
        vision = self.model.vision
        with self.model.trace(encoding):
            entering = self.model.projector.input.save()
            leaving = self.model.projector.output.save()
            tower = vision.tower_output.save()
            features = vision.image_features.save()
        close(entering, tower[0], what="projector.input vs vision.tower_output")
        assert features.shape[0] == tower.shape[1] // vision.spatial_merge_size**2 == leaving.shape[0]
        close(features, self.merged_in_token_order(leaving), what="image_features vs the merger's output")

    def windows(self, encoding: Any) -> tuple[torch.Tensor, list[int]]:
        """Qwen2.5-VL's window order of the merged squares, and each window's patch count, read off its forward."""
        with self.model.trace(encoding):
            order, bounds = self.model.vision.source.get_vision_window_index_0.output
            order, bounds = order.save(), bounds.save()
        return order, torch.as_tensor(bounds).unique_consecutive().diff().tolist()

    def merged_in_token_order(self, merged: torch.Tensor) -> torch.Tensor:
        """The merger's output in the order of the image tokens: its own, unless the tower attends in windows."""
        if self.model.vision.window_size is None:
            return merged
        order, _ = self.windows(self.encoding())
        return merged[order.argsort()]


#: The block's values in its forward's order: the streams, then the active stream's, then the streams again.
BLOCK_VALUES = (
    "layer_input",
    "predicted_streams",
    "active_input",
    "laurel.laurel_output",
    "self_attn.attention_output",
    "layer_mid",
    "mlp.mlp_output",
    "active_output",
    "ple.per_layer_output",
    "layer_output",
)


class Gemma3nLayerSuite(LayerSuite):
    """AltUp's streams through every Gemma-3n block: predicted from the entering streams, corrected by the active one.

    The layer suite's identities, with the block's own ``altup.predict`` and
    ``altup.correct`` recomputing the streams from the served values (see the
    family's docstring), and the LAuReL branch and the scaling by
    ``1 / sqrt(2)`` on the active stream.
    """

    @classmethod
    def build_model(cls) -> Any:
        # AltUp's output scale starts at zero, which zeroes the per-layer input, and its coefficients, LAuReL's and
        # the per-layer input's norms start where a term left out of the identities would go unnoticed: draw them.
        model = super().build_model()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for block in model._module.model.layers:
                for tensor in (
                    block.altup.correct_output_scale,
                    block.altup.prediction_coefs.weight,
                    block.altup.correction_coefs.weight,
                    block.laurel.post_laurel_norm.weight,
                    block.post_per_layer_input_norm.weight,
                ):
                    tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
        return model

    def read_blocks(self, written: dict[str, Any] | None = None) -> list[dict[str, torch.Tensor]]:
        """Every block's ``BLOCK_VALUES``, saved in one trace; ``written`` assigns block 0's values on the way."""
        saved: list[dict[str, torch.Tensor]] = []
        with self.model.trace(PROMPT):
            for block in self.model.layers:
                read = {}
                for name in BLOCK_VALUES:
                    owner, _, value = name.rpartition(".")
                    host = getattr(block, owner) if owner else block
                    if written and block is self.model.layers[0] and value in written:
                        setattr(host, value, written[value])
                    read[value] = getattr(host, value).save()
                saved.append(read)
        return saved

    def corrected(self, layer: int, read: dict[str, torch.Tensor], active_output: torch.Tensor) -> torch.Tensor:
        """``layer_output`` recomputed by the block's AltUp from the predicted streams and ``active_output``."""
        altup = self.model.layers[layer]._module.altup
        with torch.no_grad():
            streams = altup.correct(streams_stacked(read["predicted_streams"]), active_output)
            streams[1:] += read["per_layer_output"]
        return streams_view(streams)

    def test_contributions_add_up_to_layer_output(self) -> None:
        for layer, read in enumerate(self.read_blocks()):
            altup = self.model.layers[layer]._module.altup
            with torch.no_grad():
                predicted = streams_view(altup.predict(streams_stacked(read["layer_input"])))
            close(read["predicted_streams"], predicted, what=f"layers[{layer}]: altup.predict(layer_input)")
            active = self.model.layers[layer]._module.config.altup_active_idx
            close(read["active_input"], predicted[..., active, :], what=f"layers[{layer}]: active_input")
            close(
                read["active_output"],
                read["layer_mid"] + read["mlp_output"],
                what=f"layers[{layer}]: active_output vs layer_mid + mlp_output",
            )
            close(
                read["layer_output"],
                self.corrected(layer, read, read["active_output"]),
                what=f"layers[{layer}]: layer_output vs altup.correct(predicted_streams, active_output) + per_layer_output",
            )

    def test_layer_mid_is_input_plus_the_sequence_mixers(self) -> None:
        for layer, read in enumerate(self.read_blocks()):
            summed = (read["active_input"] + read["attention_output"] + read["laurel_output"]) / math.sqrt(2)
            close(
                read["layer_mid"],
                summed,
                what=f"layers[{layer}]: layer_mid vs (active_input + attention + laurel) / sqrt(2)",
            )

    def test_assigned_layer_mid_reaches_the_mlp_and_the_residual_it_is_added_to(self) -> None:
        """A written ``layer_mid`` is what the MLP's pre-norm reads and what its output is added to."""
        written = torch.randn(1, len(self.model.tokenizer(PROMPT).input_ids), self.model.hidden_size)
        read = self.read_blocks({"layer_mid": written})[0]
        with torch.no_grad():
            expected = self.model.layers[0]._module.pre_feedforward_layernorm(written)
            mlp = self.model.layers[0]._module.post_feedforward_layernorm(self.model.layers[0]._module.mlp(expected))
        close(read["mlp_output"], mlp, what="layers[0].mlp_output after assigning layer_mid")
        close(read["active_output"], written + mlp, what="layers[0].active_output after assigning layer_mid")
        close(read["layer_output"], self.corrected(0, read, written + mlp), what="layers[0].layer_output")


def drawn_layer_scalars(model: StandardizedTransformer) -> StandardizedTransformer:
    """``model`` with each block's ``layer_scalar`` (Gemma-4's) drawn from [0.5, 1.5), where it starts at one.

    A scalar of one would let the identities it enters pass without it.
    """
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.layers:
            scalar = layer._module.layer_scalar
            scalar.copy_(0.5 + torch.rand(scalar.shape, generator=generator))
    return model
