"""The envoys of a hybrid's blocks around its mixers: the block itself, its residual streams, a per-layer embedding."""

from __future__ import annotations

from typing import Any

import torch

from nnterp import EProperty, Layer, ManyStreams, RecurrentMixer, Sublayer, Unavailable, axis_size
from nnterp.layouts import STREAMS, Residual, Streams

#: Where ``SelfAttnMixerLayer`` keeps its ``self_attn`` child, served only when it is softmax attention.
SELF_ATTN_CHILD = "_self_attn_child"
#: The standard names of a block's sequence mixer; a hybrid's block has one of them.
MIXERS = ("linear_attn", "self_attn")


class MissingMixer(Unavailable, AttributeError):
    """A hybrid block asked for the mixer it does not have.

    An ``AttributeError`` too, so ``getattr(layer, "linear_attn", None)`` is
    ``None`` on an attention block, as on any envoy.
    """


class HybridLayer(Layer):
    """A hybrid's decoder block: ``linear_attn`` (a recurrent mixer) or ``self_attn`` (softmax attention), never both.

    Which blocks have which follows ``config.layer_types``; decide it outside
    the trace (``nnterp.testing.blocks_with(model, "linear_attn")``). Asking a
    block for the mixer it lacks raises ``MissingMixer`` naming the one it has.
    """

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup found no such child: a mixer this block does not have.
        if name not in MIXERS:
            return super().__getattr__(name)
        layer_type = getattr(self.__dict__.get("_module"), "layer_type", None)
        kind = f" (a {layer_type} block)" if layer_type else ""
        other = next(mixer for mixer in MIXERS if mixer != name)
        raise MissingMixer(
            f"no {name} module on {self.path}{kind}: a hybrid's blocks have either linear_attn or self_attn, "
            f"following config.layer_types, and this one has {other}; pick the blocks outside the trace with "
            f"nnterp.testing.blocks_with(model, {name!r})"
        )


class SelfAttnMixerLayer(HybridLayer):
    """A hybrid block whose modeling code keeps either mixer at ``self_attn`` (Kimi-Linear, Bailing-Hybrid).

    The family's ``RENAME`` serves the recurrent child as ``linear_attn``;
    this block then serves ``self_attn`` only when it is softmax attention, so
    ``self_attn`` means softmax attention on every family and the block's
    contributions are counted once.
    """

    @property
    def self_attn(self) -> Any:
        """The block's softmax attention; a recurrent block has none: its mixer is ``linear_attn``."""
        child = self.__dict__.get(SELF_ATTN_CHILD)
        if child is None or isinstance(child, RecurrentMixer):
            # An AttributeError hands the lookup to HybridLayer.__getattr__, which raises MissingMixer.
            raise AttributeError("self_attn")
        return child

    @self_attn.setter
    def self_attn(self, child: Any) -> None:
        self.__dict__[SELF_ATTN_CHILD] = child


def as_streams(envoy: Any, flat: torch.Tensor) -> torch.Tensor:
    """The streams the model holds side by side, [batch, seq, streams * hidden_size], as a view, one stream per row."""
    return flat.unflatten(-1, (axis_size(envoy, STREAMS), -1))


def side_by_side(envoy: Any, streams: torch.Tensor) -> torch.Tensor:
    """An assigned ``Streams`` tensor laid back side by side, as the model holds it."""
    return streams.flatten(-2)


def into_streams(value: EProperty, sublayer: str) -> EProperty:
    """A sublayer's contribution ``value`` on a ``StreamsLayer``: what the block adds into the streams, ``Streams``.

    For the class body of the sublayer's envoy, beside its ``CONTRIBUTION``
    (the block's operation weighting the output per stream)::

        attention_output = into_streams(LinearAttention.attention_output, "mixer")
    """
    streamed = value.laid_out(Streams)
    streamed.description = (
        f"What the {sublayer} adds to the residual streams, [batch, seq, streams, hidden_size]: its output weighted "
        "per stream"
    )
    return streamed


class StreamsLayer(ManyStreams, HybridLayer):
    """A hybrid block whose residual stream is several streams (hyper-connections, Qwen4-exp).

    The model carries ``streams`` copies of the residual side by side,
    ``[batch, seq, streams * hidden_size]``. A hyper-connection in front of
    each sublayer (``attn_hyper_connection``, ``mlp_hyper_connection``) reads
    them into the one ``[batch, seq, hidden_size]`` input the sublayer is
    called with, and the block adds the sublayer's output back into every
    stream with a weight per stream and token. The stream values
    (``layer_input``, ``layer_mid``, ``layer_output``) are served as
    ``Streams``, ``[batch, seq, streams, hidden_size]``: a view of the
    model's tensor, so in-place edits land, and an assignment is laid back
    side by side. The contributions are what the block adds into the
    streams, also ``Streams``: each sublayer's ``CONTRIBUTION`` names the
    operation in the block's forward that weights its output per stream, so::

        layer_input + attention_output + mlp_output == layer_output

    stream by stream. The sublayer's own output, before the weights, is its
    ``.output``. ``attention_norm_output`` and ``mlp_norm_output`` are what
    the sublayers are called with: the hyper-connections' reads.
    """

    # the contributions are operations in the block's forward, read after the block has started
    sourced = True

    @EProperty("input")
    def layer_input(self, value: Any) -> Streams:
        """The residual streams entering this block, [batch, seq, streams, hidden_size]. Assign or edit in place."""
        return as_streams(self, value)

    layer_input.postprocess(side_by_side)

    @EProperty("attn_hyper_connection.output")
    def attention_norm_output(self, value: Any) -> Residual:
        """What the attention is called with: its hyper-connection's read of the streams, [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value

    @EProperty("mlp_hyper_connection.input", shared=True)
    def layer_mid(self, value: Any) -> Streams:
        """The residual streams between the two sublayers, [batch, seq, streams, hidden_size].

        ``layer_input`` plus what the block adds in front of its MLP. Assign or
        edit in place.
        """
        return as_streams(self, value)

    layer_mid.postprocess(side_by_side)

    @EProperty("mlp_hyper_connection.output")
    def mlp_norm_output(self, value: Any) -> Residual:
        """What the MLP is called with: its hyper-connection's read of the streams, [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value

    @EProperty("output")
    def layer_output(self, value: Any) -> Streams:
        """The residual streams leaving this block, [batch, seq, streams, hidden_size]. Assign or edit in place."""
        return as_streams(self, value)

    layer_output.postprocess(side_by_side)

    def skip(self, hidden: Any) -> None:
        """Skip this block: it does not run, and ``hidden`` (``Streams``) takes the place of its ``layer_output``."""
        super().skip(side_by_side(self, hidden))


class PerLayerEmbedding(Sublayer):
    """A per-layer embedding (PLE) on a streams block: token n-gram features the block adds to its streams first.

    Its contribution is ``per_layer_output``, in front of the sublayers', so
    on a block that has one (``config.ple_layer_ids``) ``layer_input +
    per_layer_output + attention_output + mlp_output == layer_output``.
    """

    @EProperty("output")
    def per_layer_output(self, value: Any) -> Streams:
        """What the module adds to the residual streams, [batch, seq, streams, hidden_size]. Assign or edit in place."""
        return as_streams(self, value)

    per_layer_output.postprocess(side_by_side)
