"""Sublayers built otherwise than Llama's, shared by several families (BLOOM, MPT)."""

from __future__ import annotations

from nnterp import Mlp


class InnerResidualMlp(Mlp):
    """An MLP that adds the residual itself, ``residual + dropout(out)`` (BLOOM, MPT).

    Its output is the stream after it, not its contribution, so ``mlp_output``
    is read inside its forward, at ``CONTRIBUTION`` (the dropout before the
    addition, a ``source`` path the family names), and
    ``layer_input + attention_output + mlp_output == layer_output`` holds.
    That is read after the MLP's neurons, from inside the forward: too late to
    instrument it for that call, so it is instrumented when built (``sourced``).
    """

    sourced = True
