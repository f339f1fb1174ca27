"""Sublayers whose output the block multiplies by a number it holds before adding it to the residual stream.

Granite (and GraniteMoeHybrid, MiniCPM3, HyperCLOVA X) scale each
contribution, ``x + attn(...) * residual_multiplier``: what the block adds is
the product, which no module returns, so ``attention_output`` and
``mlp_output`` serve a scaled copy of the module's output, and an assignment
is divided back before it replaces it. ``SCALE`` names the block's attribute.
"""

from __future__ import annotations

from typing import Any, ClassVar

from nnterp import EProperty, Mlp, contribution
from nnterp.layouts import Residual

from .attention import Attention


def scale_of(envoy: Any) -> float:
    """The number the block multiplies the sublayer's output by: the block's ``SCALE`` attribute."""
    return getattr(envoy.parent._module, envoy.SCALE)


class ScaledAttention(Attention):
    """An attention whose output the block multiplies by a number it holds (``SCALE``) before adding it."""

    SCALE: ClassVar[str]

    @EProperty(contribution)
    def attention_output(self, value: Any) -> Residual:
        """What the attention adds to the residual stream: its output times the block's ``SCALE``, [batch, seq, hidden_size].

        A scaled copy: assign to replace it (the assignment is divided back).
        """
        return value * scale_of(self)

    @attention_output.postprocess
    def attention_output(self, value: Any) -> Any:
        return value / scale_of(self)


class ScaledMlp(Mlp):
    """An MLP whose output the block multiplies by a number it holds (``SCALE``) before adding it."""

    SCALE: ClassVar[str]

    @EProperty(contribution)
    def mlp_output(self, value: Any) -> Residual:
        """What the MLP adds to the residual stream: its output times the block's ``SCALE``, [batch, seq, hidden_size].

        A scaled copy: assign to replace it (the assignment is divided back).
        """
        return value * scale_of(self)

    @mlp_output.postprocess
    def mlp_output(self, value: Any) -> Any:
        return value / scale_of(self)
