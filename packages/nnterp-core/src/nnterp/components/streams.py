"""Blocks on several residual streams: how many they carry, and hyper-connections that mix them (mHC)."""

from __future__ import annotations

from operator import attrgetter
from typing import Any, ClassVar

from ..descriptor import EProperty
from ..layouts import Residual, StreamMixing, Streams, StreamWeights
from .layer import Layer


class ManyStreams:
    """A block carrying several residual streams: ``streams`` counts them, read at ``STREAMS``."""

    #: The attribute path from the block's module to its number of streams.
    STREAMS: ClassVar[str]

    @property
    def streams(self) -> int:
        """How many residual streams the block carries."""
        return attrgetter(self.STREAMS)(self._module)


def _output(name: str) -> Any:
    """The ``select`` of the hyper-connection output ``name``: its place in the tuple the block's ``HYPER_CONNECTION`` says."""
    return lambda envoy: envoy.HYPER_CONNECTION.index(name)


def _unmixed(envoy: HyperConnectionLayer) -> str | None:
    if "mixing" in envoy.HYPER_CONNECTION:
        return None
    return (
        f"{type(envoy._module).__name__}'s hyper-connections carry the streams on unmixed: what leaves a sublayer is "
        "the streams it read from plus its weighted output; read the stream weights"
    )


class HyperConnectionLayer(ManyStreams, Layer):
    """A block on residual streams that hyper-connections read, weight and mix (mHC: GLM-5-Next, DeepSeek-V4; HY-V4).

    The model carries ``streams`` residual streams stacked, ``[batch, seq,
    streams, hidden_size]``. In front of each sublayer a hyper-connection
    (``attn_hc``, ``ffn_hc``) computes from the streams, per token: the
    sublayer's input, a weighted sum of the streams
    (``attention_stream_read``); one weight per stream for the sublayer's
    output (``attention_stream_weights``); and, on an mHC block, a doubly
    stochastic ``[streams, streams]`` matrix mixing the streams that carry on
    past the sublayer (``attention_stream_mixing``). The block then leaves,
    per stream ``j``::

        layer_mid[..., j, :] = sum_i mixing[..., i, j] * layer_input[..., i, :]
                               + weights[..., j] * attention_output

    and the same with the MLP's from ``layer_mid`` to ``layer_output``; a
    block whose hyper-connections do not mix (HY-V4's) carries each stream
    on as it is, as if ``mixing`` were the identity, and says so when asked
    for it. So the contributions do not simply add up. ``attention_output``
    and ``mlp_output`` are the sublayers' own outputs, ``[batch, seq,
    hidden_size]``, which the weights spread into the streams. The weights
    and the mixing are float32, as the model computes them; all of these
    values can be assigned or edited in place. ``HYPER_CONNECTION`` names
    what each hyper-connection returns, in its order.
    """

    #: What the block's hyper-connections return, in order: ``"weights"``, ``"mixing"`` (mHC only) and ``"read"``.
    HYPER_CONNECTION: ClassVar[tuple[str, ...]] = ("weights", "mixing", "read")

    @EProperty("input")
    def layer_input(self, value: Any) -> Streams:
        """The residual streams entering this block, [batch, seq, streams, hidden_size]. Assign or edit in place."""
        return value

    @EProperty("attn_hc.output", select=_output("read"))
    def attention_stream_read(self, value: Any) -> Residual:
        """The attention's read of the streams, their per-token weighted sum, [batch, seq, hidden_size].

        What the attention's pre-norm is called with. Assign or edit in place.
        """
        return value

    @EProperty("attn_hc.output", select=_output("weights"))
    def attention_stream_weights(self, value: Any) -> StreamWeights:
        """How much of the attention's output each stream receives, [batch, seq, streams]. Assign or edit in place."""
        return value

    @EProperty("attn_hc.output", select=_output("mixing"), unavailable=_unmixed)
    def attention_stream_mixing(self, value: Any) -> StreamMixing:
        """How the streams carry on past the attention: row i, column j is stream i's share in stream j, [batch, seq, streams, streams].

        Assign or edit in place.
        """
        return value

    @EProperty("ffn_hc.input", shared=True)
    def layer_mid(self, value: Any) -> Streams:
        """The residual streams between the two sublayers, [batch, seq, streams, hidden_size]. Assign or edit in place."""
        return value

    @EProperty("ffn_hc.output", select=_output("read"))
    def mlp_stream_read(self, value: Any) -> Residual:
        """The MLP's read of the streams, their per-token weighted sum, [batch, seq, hidden_size].

        What the MLP's pre-norm is called with. Assign or edit in place.
        """
        return value

    @EProperty("ffn_hc.output", select=_output("weights"))
    def mlp_stream_weights(self, value: Any) -> StreamWeights:
        """How much of the MLP's output each stream receives, [batch, seq, streams]. Assign or edit in place."""
        return value

    @EProperty("ffn_hc.output", select=_output("mixing"), unavailable=_unmixed)
    def mlp_stream_mixing(self, value: Any) -> StreamMixing:
        """How the streams carry on past the MLP: row i, column j is stream i's share in stream j, [batch, seq, streams, streams].

        Assign or edit in place.
        """
        return value

    @EProperty("output")
    def layer_output(self, value: Any) -> Streams:
        """The residual streams leaving this block, [batch, seq, streams, hidden_size]. Assign or edit in place."""
        return value
