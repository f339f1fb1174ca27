"""Conformance suites for the attentions this plugin adds beyond ``nnterp.testing``'s."""

from __future__ import annotations

import torch

from nnterp.testing import PROMPT, AttentionSuite, close

from .attention import OUTPUT_PROJECTIONS


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

    def test_head_outputs_take_in_place_edits_and_assignment(self) -> None:
        """Zeroing the last position's head outputs, in place or by assignment, leaves that position the projection's bias."""
        attention = self.model.layers[0].self_attn
        projection = next(getattr(attention, name) for name in OUTPUT_PROJECTIONS if hasattr(attention._module, name))
        with self.model.trace(PROMPT):
            clean = attention.attention_output.save()
        with self.model.trace(PROMPT):
            attention.attention_head_outputs[:, -1] = 0
            edited = attention.attention_output.save()
        with self.model.trace(PROMPT):
            zeroed = attention.attention_head_outputs.clone()
            zeroed[:, -1] = 0
            attention.attention_head_outputs = zeroed
            assigned = attention.attention_output.save()
        bias = projection._module.bias
        expected = torch.zeros_like(edited[0, -1]) if bias is None else bias
        close(edited[:, :-1], clean[:, :-1], what="outputs before the edited position")
        close(edited[0, -1], expected, what="the edited position's output: the output projection's bias alone")
        close(assigned, edited, what="assigned vs in-place zeroed head outputs")
