"""LocalAttention: softmax attention over a sliding window of the last keys, as Griffin's attention blocks attend."""

from __future__ import annotations

from nnterp_attention import Attention


class LocalAttention(Attention):
    """A softmax attention whose queries each see only the last ``window`` keys, themselves included.

    Every value is ``Attention``'s, read at the eager interface: the window is
    the model's own mask (its ``sliding_window``, from the config's
    ``attention_window_size``), added to the scores before the softmax. On a
    prompt longer than the window, a query's scores at the keys before its
    window are the mask's minimum and its pattern there is zero; on a decode
    step past the window, the cache keeps only the window's keys.
    """

    @property
    def window(self) -> int:
        """How many keys each query sees, itself included: the module's ``sliding_window``."""
        return self._module.sliding_window
