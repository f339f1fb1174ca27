"""Conformance suites for the attentions this plugin adds beyond ``nnterp.testing``'s."""

from __future__ import annotations

import torch

from nnterp.testing import PROMPT, AttentionSuite, close


def causal_softmax(bias: torch.Tensor) -> torch.Tensor:
    """The pattern a bias that depends on the key alone gives, [..., seq, seq]: its softmax over each query's causal keys.

    ``bias`` is [..., 1, seq] (one row, every key), as ALiBi's is.
    """
    seq = bias.shape[-1]
    future = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=bias.device), diagonal=1)
    return torch.softmax(bias.float().expand(*bias.shape[:-2], seq, seq).masked_fill(future, float("-inf")), dim=-1)


class AlibiAttentionSuite(AttentionSuite):
    """Softmax attention under an ALiBi bias (BLOOM, MPT): ``AttentionSuite``, with zero queries leaving the bias."""

    def test_zero_queries_give_uniform_causal_pattern(self) -> None:
        """Zero queries (or keys) leave the scores to the bias, which depends on the key alone, not a uniform pattern.

        So every query's pattern is the softmax of the last query's scores over its own causal keys.
        """
        for layer in self.attention_blocks():
            attention = self.model.layers[layer].self_attn
            for name in ("attention_queries", "attention_keys"):
                with self.model.trace(PROMPT):
                    setattr(attention, name, torch.zeros_like(getattr(attention, name)))
                    scores = attention.attention_scores.save()
                    pattern = attention.attention_probabilities.save()
                close(pattern, causal_softmax(scores[..., -1:, :]), what=f"layers[{layer}] pattern under zero {name}")
