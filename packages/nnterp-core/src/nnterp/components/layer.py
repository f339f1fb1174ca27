"""Layer: a decoder block and the residual stream through it."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import torch
import transformers

from ..descriptor import EProperty
from ..forward_source import ForwardSource, NotInForward
from ..layouts import Residual
from .standard import Standard

PARALLEL = "a parallel block: the attention and the MLP read the same input, so there is no stream between them"
POST_NORM_ATTENTION = "a post-norm block: the attention reads the residual stream itself, layer_input"
POST_NORM_MLP = "a post-norm block: the MLP reads the residual stream between the sublayers, layer_mid"
#: The standard names of a block's sequence mixers: its recurrent mixer and its softmax attention.
RECURRENT_MIXER, ATTENTION = "linear_attn", "self_attn"


class Layer(Standard):
    """A decoder block: the residual stream entering it, leaving it, and the boundaries inside it.

    Its children carry the rest under standard names, where the block has
    them: ``self_attn`` (softmax attention), ``linear_attn`` (a recurrent
    mixer), ``mlp`` (the feed-forward), and on a pre-norm block
    ``input_layernorm`` and ``post_attention_layernorm``, the norms in front
    of the two sublayers (a family whose norms sit elsewhere says what its
    names mean).

    The values are defined on the pre-norm block,
    ``x + attn(norm1(x))`` then ``+ mlp(norm2(.))``, and keyed on the aliased
    norms; a family whose block is built otherwise points them at its own
    modules or marks them unavailable with the reason. Whatever the block, the
    contributions add up::

        layer_input + attention_output + mlp_output == layer_output

    except on a post-norm block (BART's), which normalizes the stream right
    after each addition (``stream_norms``): there
    ``layer_output == norm2(norm1(layer_input + attention_output) + mlp_output)``,
    and on a block that weighs the stream and the contribution in its sum
    (Doge's, ZAYA's, Beam's). ``stream_after_adding`` is each addition as the
    block computes it, whatever the block.
    """

    def attention_first(self) -> bool:
        """Whether the block runs its attention (``self_attn``) before its recurrent mixer (``linear_attn``).

        Read from the block's forward: which of the attributes holding them it
        calls first (Zamba's hybrid block calls its shared transformer before
        its Mamba decoder, Falcon-H1's its Mamba before its attention). An
        analysis touching both reads and writes them in that order. False
        where the block lacks either.

        Raises:
            NotInForward: the forward does not itself call both attributes, so the order cannot be read.
        """
        recurrent, attention = getattr(self, RECURRENT_MIXER, None), getattr(self, ATTENTION, None)
        if recurrent is None or attention is None:
            return False
        paths = {id(module): path for path, module in self._module.named_modules()}
        holders = [paths[id(mixer._module)].split(".")[0] for mixer in (recurrent, attention)]
        forward = ForwardSource.of(type(self._module).forward)
        called = [operation.called for operation in forward.operations]
        first = {holder: called.index(f"self.{holder}") for holder in holders if f"self.{holder}" in called}
        if len(first) < len(set(holders)) or len(set(holders)) == 1:
            raise NotInForward(
                f"{forward.name} (transformers {transformers.__version__}) was expected to call self.{holders[0]} "
                f"(holding {RECURRENT_MIXER}) and self.{holders[1]} (holding {ATTENTION}) itself; it calls "
                f"{sorted(set(name for name in called if name and name.startswith('self.')))}, so which runs first "
                f"cannot be read"
            )
        return first[holders[1]] < first[holders[0]]

    def stream_after_adding(self, index: int, stream: torch.Tensor, contribution: torch.Tensor) -> torch.Tensor:
        """The residual stream after the block's addition number ``index``, recomputed from its two operands.

        ``index`` counts the block's additions in the forward's order (0: the
        attention's, 1: the MLP's on a two-sublayer block); ``stream`` is the
        stream entering that addition (``layer_input``, ``layer_mid``) and
        ``contribution`` the sublayer's output added to it. The default is
        ``stream + contribution``, then the ``stream_norms`` entry for
        ``index``, if any; a family whose block weighs its operands says how.
        Call it outside a trace, on saved tensors: it runs the block's own
        modules and parameters, without gradient. With it,
        ``layer_output`` is ``layer_input`` folded through every addition.
        """
        stream = stream + contribution
        norms = self.stream_norms()
        norm = norms[index] if index < len(norms) else None
        if norm is None:
            return stream
        step = attrgetter(norm)(self._module)
        with torch.no_grad():
            return step(stream) if isinstance(step, torch.nn.Module) else stream * step

    def stream_norms(self) -> tuple[str | None, ...]:
        """The norms the block applies to the residual stream right after adding each contribution, in their order.

        Names relative to the block, ``None`` where a contribution is added and
        the stream goes on as it is; empty (the default) where that is every
        contribution, as on a pre-norm block. A name may also be a tensor the
        block multiplies the stream by (Gemma-4's buffer ``layer_scalar``).
        """
        return ()

    @EProperty("input")
    def layer_input(self, value: Any) -> Residual:
        """The residual stream entering this block, before any of its norms, [batch, seq, hidden_size].

        The block's first argument. With the sublayers' contributions it is the
        identity the boundary values are defined by. Assign or edit in place.
        """
        return value

    @EProperty("input_layernorm.output")
    def attention_norm_output(self, value: Any) -> Residual:
        """What the attention is called with: its pre-norm's output, [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value

    @EProperty("post_attention_layernorm.input", shared=True)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the two sublayers, [batch, seq, hidden_size].

        ``layer_input + attention_output`` on a pre-norm block, read as what the
        MLP's pre-norm is called with. A parallel block has no such stream.
        Assign or edit in place: either reaches the MLP's norm and the residual
        the MLP's output is added to, which the forward holds as the same tensor.
        """
        return value

    @EProperty("post_attention_layernorm.output")
    def mlp_norm_output(self, value: Any) -> Residual:
        """The MLP's pre-norm output, [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value

    @EProperty("mlp.input")
    def mlp_input(self, value: Any) -> Residual:
        """What the MLP is called with, [batch, seq, hidden_size].

        The same tensor as ``mlp_norm_output`` where nothing sits between the
        norm and the MLP. Assign or edit in place.
        """
        return value

    @EProperty("output")
    def layer_output(self, value: Any) -> Residual:
        """The residual stream leaving this block, [batch, seq, hidden_size].

        The block's output (its first element when the block returns a
        tuple). Assign or edit in place.
        """
        return value

    def skip(self, hidden: Any) -> None:
        """Skip this block: it does not run, and ``hidden`` takes the place of its ``layer_output``.

        Call it inside a trace, before the block runs.
        """
        super().skip(hidden)


class TupleLayer(Layer):
    """A block whose forward returns a tuple, the hidden states first (BLOOM, MPT, Bamba, Falcon-H1).

    ``skip`` hands the next block the same shape: the hidden states, then
    ``None`` in the place of what else the block returns (attention weights,
    indexer choices: nothing the model's layer loop reads on).
    """

    #: How many elements the block's forward returns.
    RETURNED = 2

    def skip(self, hidden: Any) -> None:
        """Skip this block: it does not run, and ``hidden`` takes the place of its ``layer_output``, packed as the block packs it."""
        super().skip((hidden, *([None] * (self.RETURNED - 1))))
