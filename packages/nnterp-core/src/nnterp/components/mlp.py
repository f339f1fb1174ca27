"""Mlp: a feed-forward sublayer and its neurons."""

from __future__ import annotations

from typing import Any

from nnsight import Envoy

from ..descriptor import EProperty
from ..layouts import Neurons, Residual
from .standard import Sublayer, contribution


def missing(child: str):
    """The ``unavailable=`` of a value read at the MLP's child ``child``: a reason when the MLP has no such module."""

    def reason(mlp: Mlp) -> str | None:
        if isinstance(getattr(mlp, child, None), Envoy):
            return None
        return (
            f"this MLP ({type(mlp._module).__name__}) has no {child} module, where the value is read; a family "
            f"for this model aliases its own module to {child!r} in its RENAME"
        )

    return reason


class Mlp(Sublayer):
    """A feed-forward module: its contribution to the residual stream and its neurons.

    The activation is ``act_fn`` and the output projection ``down_proj``; a
    family aliases its own spellings (``act``, ``c_proj``, ``dense_4h_to_h``,
    ``fc2``) to them in its ``RENAME``.
    """

    @property
    def intermediate_size(self) -> int:
        """Width of this MLP's hidden layer, read off the module (its ``intermediate_size``, else the down projection's input width)."""
        module = self._module
        size = getattr(module, "intermediate_size", None)
        if isinstance(size, int):
            return size
        down = self.down_proj._module
        weight = down.weight
        return weight.shape[1] if hasattr(down, "in_features") else weight.shape[0]

    @EProperty(contribution)
    def mlp_output(self, value: Any) -> Residual:
        """What the MLP adds to the residual stream, [batch, seq, hidden_size].

        The module's output, or where the block changes it on the way in
        (``CONTRIBUTION``). Assign or edit in place.
        """
        return value

    @EProperty("act_fn.output", unavailable=missing("act_fn"))
    def mlp_activation(self, value: Any) -> Neurons:
        """The activation's output, [batch, seq, intermediate_size].

        ``act(gate_proj(x))`` on a gated MLP, ``act(up_proj(x))`` on a plain
        one. Assign or edit in place.
        """
        return value

    @EProperty("down_proj.input", unavailable=missing("down_proj"))
    def mlp_neurons(self, value: Any) -> Neurons:
        """The neurons the output projection sums, [batch, seq, intermediate_size].

        ``act(gate_proj(x)) * up_proj(x)`` on a gated MLP; on a plain one the
        same tensor as ``mlp_activation``. Assign or edit in place.
        """
        return value
