"""The block around an mLSTM layer: it returns its hidden states and the layer's new (C, n, m) state."""

from __future__ import annotations

from typing import Any

from nnterp import Layer


class MatrixMemoryBlock(Layer):
    """An xLSTM block, ``x + mlstm(norm(x))`` then ``+ ffn(norm(.))``, returning ``(hidden, state)``.

    The model's loop copies the returned state into its cache, so ``skip``
    hands back the state the block was given: a skipped block leaves its
    layer's state as it was.
    """

    def skip(self, hidden: Any) -> None:
        """Skip this block: it does not run, ``hidden`` takes the place of its ``layer_output``, its state stays."""
        args, kwargs = self.inputs
        state = args[1] if len(args) > 1 else kwargs.get("state")
        super().skip((hidden, state))
