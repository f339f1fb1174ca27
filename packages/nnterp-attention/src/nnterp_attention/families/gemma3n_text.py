"""Gemma-3n's text model: Gemma-3's sandwich sublayers on one of several AltUp streams, beside a LAuReL branch.

The model carries ``altup_num_inputs`` residual streams (AltUp, Alternating
Updates), which the block receives and returns stacked streams first; they
are served as ``Streams``, ``[batch, seq, streams, hidden_size]``, a view of
the model's tensor (in-place edits land; an assignment is stacked back). The
block runs its sublayers on one stream, the active one
(``config.altup_active_idx``), and carries the others along::

    predicted_streams = altup.predict(layer_input)        # each stream predicted from all of them, per token
    active_input      = predicted_streams[..., active, :]  # what the sublayers read and add to
    layer_mid         = (active_input + attention_output + laurel_output) / sqrt(2)
    active_output     = layer_mid + mlp_output
    layer_output      = altup.correct(predicted_streams, active_output)   # every stream moved towards active_output
    layer_output[..., 1:, :] += per_layer_output

``altup.correct`` adds to each predicted stream ``i`` a per-token multiple
of ``active_output - active_input``, its coefficient computed from
``active_output``. So ``layer_input`` and ``layer_output`` are the streams,
and ``layer_mid`` and the sublayers' values live on the active stream,
``[batch, seq, hidden_size]``. ``attention_output`` and ``mlp_output`` are
read after their post-norms, as on Gemma-3. ``laurel_output`` is the LAuReL
block's output (``laurel``): the attention's normed input plus its learned
low-rank residual, added beside the attention. ``per_layer_output``
(``ple``) is what the per-layer input adds to every stream but the first:
the corrected active stream, scaled by ``altup.correct_output_scale``,
gated by the block's slice of the per-layer token embeddings, projected and
normalized.

With ``activation_sparsity_pattern`` above zero for a block, its MLP keeps
only the gate values above a cutoff (the gate's mean plus a multiple of its
standard deviation per token) before the activation, so ``mlp_activation``
is zero at most neurons there.

The last ``num_kv_shared_layers`` blocks project no keys or values: they
attend over those of the last earlier block of their type (its
``attention_keys`` and ``attention_values``, which their attention interface
receives and serves). That block hands them over before its own interface
call, so assigning its keys or values changes its own attention only, while
an in-place edit reaches the blocks that reuse them; such a block cannot be
skipped.

The streams axis comes first in the model's tensors, where nnsight looks
for the batch, so the stream values (``layer_input``, ``predicted_streams``,
``layer_output``) cannot be split by invoke: in a trace with several invokes
they raise (``ONE_INVOKE``); read and write them in a trace with one.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.gemma3n import modeling_gemma3n as MODELING

from nnterp import EProperty, ManyStreams, Sublayer
from nnterp.descriptor import invoke_rows
from nnterp.forward_source import Call, ForwardSource
from nnterp.layouts import Residual, Streams
from nnterp_attention.post_norm import PostNormAttention, PostNormMlp, SandwichLayer
from nnterp_attention.shared_kv import refuse_skipping_a_kv_source

_BLOCK = ForwardSource.of(MODELING.Gemma3nTextDecoderLayer.forward)
#: nnsight's labels, in this transformers, of the block's calls of AltUp's predict and correct steps.
PREDICT = _BLOCK.find(Call("self.altup.predict")).label
CORRECT = _BLOCK.find(Call("self.altup.correct")).label
ONE_INVOKE = (
    "Gemma-3n holds its residual streams streams-first, [streams, batch, seq, hidden_size], and nnsight splits a "
    "batch by invoke along the first axis, so a stream value cannot be served per invoke; read and write "
    "layer_input, predicted_streams and layer_output in a trace with one invoke (a batch of prompts in it is fine)"
)


def streams_view(stacked: torch.Tensor) -> torch.Tensor:
    """The model's ``[streams, batch, seq, hidden_size]`` as ``Streams``, ``[batch, seq, streams, hidden_size]``: a view."""
    return stacked.permute(1, 2, 0, 3)


def streams_stacked(streams: torch.Tensor) -> torch.Tensor:
    """``Streams`` stacked streams first, as the model holds them."""
    return streams.permute(2, 0, 1, 3)


def as_streams(envoy: Any, stacked: Any) -> Any:
    """A stream value as served (``streams_view``), in a trace of one invoke.

    Raises:
        ValueError: the trace runs several invokes (``ONE_INVOKE``).
    """
    _one_invoke()
    return streams_view(stacked)


def stacked(envoy: Any, streams: Any) -> Any:
    """An assigned stream value as the model holds it (``streams_stacked``), in a trace of one invoke."""
    _one_invoke()
    return streams_stacked(streams)


def _one_invoke() -> None:
    total, _, size = invoke_rows("a Gemma-3n stream value")
    if size != total:
        raise ValueError(ONE_INVOKE)


class Gemma3nLayer(ManyStreams, SandwichLayer):
    """Gemma-3n's block: AltUp's streams in and out, a sandwich block on the active stream in between."""

    STREAMS = "config.altup_num_inputs"
    # predicted_streams and active_output are operations in the block's forward, read after it has started
    sourced = True

    @EProperty("input")
    def layer_input(self, value: Any) -> Streams:
        """The residual streams entering this block, [batch, seq, streams, hidden_size]. Assign or edit in place."""
        return as_streams(self, value)

    layer_input.postprocess(stacked)

    @EProperty(f"source.{PREDICT}.output")
    def predicted_streams(self, value: Any) -> Streams:
        """AltUp's prediction of every stream, each a per-token mix of all of them, [batch, seq, streams, hidden_size].

        ``predicted_streams[..., s, :] = layer_input[..., s, :] + sum_j c[..., s, j] * layer_input[..., j, :]``,
        ``c`` computed from the active stream. Assign or edit in place.
        """
        return as_streams(self, value)

    predicted_streams.postprocess(stacked)

    @EProperty("input_layernorm.input", shared=True)
    def active_input(self, value: Any) -> Residual:
        """The active stream's prediction, [batch, seq, hidden_size]: what the sublayers read and add to.

        Assign or edit in place: either reaches the attention's pre-norm, the
        residual the sublayers' outputs are added to, and the prediction
        AltUp corrects.
        """
        return value

    @EProperty(f"source.{CORRECT}.inputs", select=1)
    def active_output(self, value: Any) -> Residual:
        """The active stream after the sublayers, ``layer_mid + mlp_output``, [batch, seq, hidden_size].

        What AltUp corrects every predicted stream by. Assign or edit in place.
        """
        return value

    @EProperty("output")
    def layer_output(self, value: Any) -> Streams:
        """The residual streams leaving this block, [batch, seq, streams, hidden_size]. Assign or edit in place."""
        return as_streams(self, value)

    layer_output.postprocess(stacked)

    def skip(self, hidden: Any) -> None:
        """Skip this block: it does not run, and ``hidden`` (``Streams``) takes the place of its ``layer_output``.

        Refused on a block whose keys and values later blocks reuse
        (``num_kv_shared_layers``): they would find none.
        """
        refuse_skipping_a_kv_source(self)
        super().skip(stacked(self, hidden))


class Gemma3nLaurel(Sublayer):
    """LAuReL, the learned augmented residual: ``x + post_laurel_norm(linear_right(linear_left(x)))``, ``x`` the attention's input."""

    @EProperty("output")
    def laurel_output(self, value: Any) -> Residual:
        """What the block adds beside the attention's output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value


class Gemma3nPerLayerInput(Sublayer):
    """The per-layer input (PLE), served at the last module of its branch, the norm whose output the block adds."""

    @EProperty("output")
    def per_layer_output(self, value: Any) -> Residual:
        """What the per-layer input adds to every stream but the first, [batch, seq, hidden_size]. Assign or edit in place."""
        return value


MODEL_TYPES = ("gemma3n_text",)
ENVOYS = {
    MODELING.Gemma3nTextDecoderLayer: Gemma3nLayer,
    MODELING.Gemma3nTextAttention: PostNormAttention,
    MODELING.Gemma3nTextMLP: PostNormMlp,
    MODELING.Gemma3nTextLaurelBlock: Gemma3nLaurel,
    "post_per_layer_input_norm": Gemma3nPerLayerInput,
}
RENAME = {"post_per_layer_input_norm": "ple"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    sliding_window=64,  # longer than the test prompts, so every pattern is the full causal one
    layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"],
    num_kv_shared_layers=1,  # the last block attends over the third's keys and values
    activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0],  # the first block's MLP keeps its top gate values only
    laurel_rank=8,
    altup_num_inputs=3,  # streams enough that a coefficient landing on the wrong one shows
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=64,
)
