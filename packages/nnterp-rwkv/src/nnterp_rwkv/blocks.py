"""The RWKV block around a WKV mixer: where its residual stream starts, and the model's halving after it."""

from __future__ import annotations

from typing import Any

from nnterp import EProperty, Layer
from nnterp.layouts import Residual


def _stream_start(layer: "RwkvLayer") -> str:
    # block 0 normalizes the embeddings (pre_ln) before its first addition: the stream starts there
    return "pre_ln.output" if layer._module.layer_id == 0 else "input"


class RwkvLayer(Layer):
    """An RWKV block: ``x + attention(ln1(x))``, then ``+ feed_forward(ln2(.))``.

    ``linear_attn`` is the time mixing (a ``Wkv``), ``mlp`` the channel mixing
    (a token-shifted feed-forward, ``receptance * value``),
    ``input_layernorm`` and ``post_attention_layernorm`` are ``ln1`` and ``ln2``.
    ``layer_input + linear_attn.attention_output + mlp.mlp_output == layer_output``
    on every block.

    Two things sit outside the sublayers. Block 0 first normalizes its input
    with ``pre_ln``: its ``layer_input`` is that norm's output, where the
    residual stream starts (the embeddings are ``embed_tokens``' output). And in
    inference the model halves the stream after every ``rescale_every``-th
    block (its output projections were divided to match), so there the next
    block's ``layer_input`` is this block's ``layer_output / 2``
    (``halves_after``).
    """

    @EProperty(_stream_start)
    def layer_input(self, value: Any) -> Residual:
        """The residual stream entering this block, [batch, seq, hidden_size]: on block 0, ``pre_ln``'s output.

        Assign or edit in place.
        """
        return value

    def skip(self, hidden: Any) -> None:
        """Skip this block: it does not run, ``hidden`` is its ``layer_output``, and the model's state list passes on.

        The block returns ``(hidden, state, attentions)`` and the model's loop
        hands the state list to the next block, so it goes on unchanged (this
        block's slices of it keep what they held). Call it before reading any
        value inside the block: on block 0 that includes ``layer_input``,
        ``pre_ln``'s output.
        """
        args, kwargs = self.inputs
        state = kwargs.get("state", args[1] if len(args) > 1 else None)
        super().skip((hidden, state, None))

    @property
    def halves_after(self) -> bool:
        """Whether the model halves the stream after this block (inference with ``rescale_every`` reached)."""
        model = self._module
        config = model.config
        every = config.rescale_every
        return not model.training and every > 0 and (model.layer_id + 1) % every == 0
