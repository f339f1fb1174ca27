"""Attentions that compute their pattern in their own forward, not through transformers' attention interface.

BLOOM and MPT predate the shared interface: under every implementation they
accept (eager alone), their forward multiplies the queries and keys, adds the
ALiBi bias and the mask, takes the softmax and mixes the values itself. So
their interior is read at those operations, which the family names; each value
means what it means on ``Attention`` and is served in the same layout.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from nnterp import EProperty
from nnterp.layouts import HeadOutputs, Keys, Pattern, Queries, Values

from .attention import Attention


def _at(place: str):
    return lambda envoy: getattr(envoy, place)


def _element(place: str):
    return lambda envoy: envoy.ELEMENTS.get(place)


def _missing(place: str):
    return lambda envoy: envoy.unmaterialized(place)


class OwnArithmeticAttention(Attention):
    """A softmax attention whose forward computes the pattern itself (BLOOM, MPT), read at its own operations.

    The family names where each value is read, a path from the module (through
    ``source`` to an operation of its forward), in the order the forward
    produces them, the order ``Attention``'s values are read in: the queries,
    keys and values where the forward lays them out by head (after the cache
    update or before it: see the family), the scores at the softmax's input,
    the pattern after the dropout that follows it, and the head outputs as the
    product with the values returns them, heads before the sequence. A forward
    that folds the heads into the batch axis (BLOOM's ``baddbmm`` and ``bmm``
    take ``[batch * num_heads, ...]``) sets ``HEADS_IN_BATCH``; a place that
    returns a tuple (a cache update's keys and values) names the element in
    ``ELEMENTS``. Where the forward computes a value on some calls only
    (Falcon's under sdpa), ``unmaterialized`` says why it is unavailable on
    the others. Each value is
    served in ``Attention``'s layout, as a view of the model's tensor: an
    in-place edit reaches the model wherever torch allows one, and an
    assignment is laid back out the way the forward holds it.

    An operation is served only on a call whose forward was instrumented
    before the call began, and these are read after values of the module's
    children (BLOOM's pattern is its dropout module's output, its head outputs
    an operation after it), so the forward is instrumented when built
    (``sourced``); a contribution read inside it (BLOOM's) is served too.
    """

    sourced = True
    QUERIES: ClassVar[str]
    KEYS: ClassVar[str]
    VALUES: ClassVar[str]
    SCORES: ClassVar[str]
    PATTERN: ClassVar[str]
    HEAD_OUTPUTS: ClassVar[str]
    #: Whether the products take the heads folded into the batch axis, ``[batch * num_heads, ...]``.
    HEADS_IN_BATCH: ClassVar[bool] = False
    #: The element of a place's tuple each value is, by place name (``{"KEYS": 0, "VALUES": 1}``); the first if absent.
    ELEMENTS: ClassVar[dict[str, int]] = {}

    def unmaterialized(self, place: str) -> str | None:
        """Why this module's forward does not compute the value read at ``place`` (``"SCORES"``), or ``None``.

        BLOOM and MPT compute every value under the only implementation they
        accept; a family whose forward hands some to a fused kernel says so here.
        """
        return None

    def _unfold(self, value: torch.Tensor) -> torch.Tensor:
        return value.unflatten(0, (-1, self.num_heads)) if self.HEADS_IN_BATCH else value

    def _fold(self, value: torch.Tensor) -> torch.Tensor:
        return value.flatten(0, 1) if self.HEADS_IN_BATCH else value

    @EProperty(_at("QUERIES"), select=_element("QUERIES"), unavailable=_missing("QUERIES"))
    def attention_queries(self, value: Any) -> Queries:
        """The queries the scores are computed with, [batch, num_heads, seq, qk_head_dim].

        Assign to replace them, or edit in place where torch allows it (not
        on a view of a fused projection's ``chunk``: see the family).
        """
        return self._unfold(value)

    @attention_queries.postprocess
    def attention_queries(self, value: torch.Tensor) -> torch.Tensor:
        return self._fold(value)

    @EProperty(_at("KEYS"), select=_element("KEYS"), unavailable=_missing("KEYS"))
    def attention_keys(self, value: Any) -> Keys:
        """The keys the scores are computed with, [batch, num_kv_heads, seq, qk_head_dim].

        Assign to replace them, or edit in place where torch allows it (see
        ``attention_queries``).
        """
        return self._unfold(value)

    @attention_keys.postprocess
    def attention_keys(self, value: torch.Tensor) -> torch.Tensor:
        return self._fold(value)

    @EProperty(_at("VALUES"), select=_element("VALUES"), unavailable=_missing("VALUES"))
    def attention_values(self, value: Any) -> Values:
        """The values the pattern is multiplied with, [batch, num_kv_heads, seq, head_dim].

        Assign to replace them, or edit in place where torch allows it (see
        ``attention_queries``).
        """
        return self._unfold(value)

    @attention_values.postprocess
    def attention_values(self, value: torch.Tensor) -> torch.Tensor:
        return self._fold(value)

    @EProperty(_at("SCORES"), select=_element("SCORES"), unavailable=_missing("SCORES"))
    def attention_scores(self, value: Any) -> Pattern:
        """The scaled scores entering the softmax, [batch, num_heads, query, key], with the ALiBi bias and the mask added.

        ``softmax(attention_scores)`` is ``attention_probabilities`` up to the
        dtype cast. Assign or edit in place.
        """
        return value

    @EProperty(_at("PATTERN"), select=_element("PATTERN"), unavailable=_missing("PATTERN"))
    def attention_probabilities(self, value: Any) -> Pattern:
        """The attention pattern the values are mixed with, [batch, num_heads, query, key], in the model's dtype.

        Each row sums to one. Read it, edit it in place, or assign a tensor of
        the same shape.
        """
        return value

    @EProperty(_at("HEAD_OUTPUTS"), select=_element("HEAD_OUTPUTS"), unavailable=_missing("HEAD_OUTPUTS"))
    def attention_head_outputs(self, value: Any) -> HeadOutputs:
        """Each head's output before the heads are concatenated and projected, [batch, seq, num_heads, head_dim].

        The value product's result, served as a transposed view. Assign or
        edit in place.
        """
        return self._unfold(value).transpose(1, 2)

    @attention_head_outputs.postprocess
    def attention_head_outputs(self, value: torch.Tensor) -> torch.Tensor:
        return self._fold(value.transpose(1, 2))
