"""Attention with sinks: a learned logit per head that takes part in the softmax and mixes no value.

GPT-OSS's eager attention concatenates each head's sink logit to every row of
the scores, ``torch.cat([scores, sinks], dim=-1)``, takes the softmax over the
keys and the sink, and drops the sink's column before mixing the values. So
the scores are read where they enter that concatenation, without the sink's
column, and the pattern is what the values are mixed with: each row sums to
one less what went to the sink.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from nnterp import EProperty
from nnterp.layouts import Pattern
from nnterp.value_paths import ArgumentSelection

from .attention import Attention, _inside_interface, interface_reason


@dataclass(frozen=True)
class Listed(ArgumentSelection):
    """One tensor of the list a call takes as its first argument: ``torch.cat([scores, sinks])``'s scores."""

    index: int = 0

    def pick(self, arguments: tuple[tuple, dict]) -> Any:
        return arguments[0][0][self.index]

    def place(self, arguments: tuple[tuple, dict], value: Any) -> tuple[tuple, dict]:
        args, kwargs = arguments
        listed = list(args[0])
        listed[self.index] = value
        return (listed, *args[1:]), kwargs


SCORES = Listed(0)


class SinkAttention(Attention):
    """A softmax attention whose softmax also runs over a learned sink per head, whose column is then dropped.

    The queries, keys, values and head outputs are ``Attention``'s. The
    scores are read as the concatenation with the sinks (``CONCAT``) receives
    them, and the pattern after the dropout, as on ``Attention``: with the
    sink logit ``s`` of its head (``sink_logits``), a row of the pattern is
    ``softmax([scores, s])`` less its last entry, so it sums to less than one.
    """

    #: Inside the eager function: the concatenation of the scores with the sinks, the softmax's input.
    CONCAT: ClassVar[str] = "torch_cat_0"
    #: The module's parameter holding one sink logit per head.
    SINKS: ClassVar[str] = "sinks"

    @property
    def sink_logits(self) -> torch.Tensor:
        """Each head's sink logit, [num_heads]: the column the softmax sees after every row of scores.

        ``-inf`` on a block of a family whose other blocks have sinks but this
        one has none (MiMo-V2-Flash's full-attention blocks): a sink that
        takes no probability.
        """
        sinks = getattr(self._module, self.SINKS)
        return torch.full((self.num_heads,), float("-inf")) if sinks is None else sinks

    @EProperty(_inside_interface("CONCAT", "inputs"), select=SCORES, unavailable=interface_reason)
    def attention_scores(self, value: Any) -> Pattern:
        """The scaled, masked scores, [batch, num_heads, query, key], before the sink's column is added to them.

        ``softmax(cat([attention_scores, sink_logits]))[..., :-1]`` is
        ``attention_probabilities`` up to the dtype cast. Assign or edit in
        place.
        """
        return value

    @EProperty(_inside_interface("DROPOUT", "output"), unavailable=interface_reason)
    def attention_probabilities(self, value: Any) -> Pattern:
        """The attention pattern, [batch, num_heads, query, key], without the sink's column.

        The post-softmax probabilities the values are mixed with, in the
        model's dtype; each row sums to one less the probability its head's
        sink took. Read it, edit it in place, or assign a tensor of the same
        shape.
        """
        return value
