import pytest
import torch
from transformers.models.mpt import modeling_mpt as MODELING

from nnterp.testing import PROMPT, close, family_suite, tiny_standardized
from nnterp_attention.testing import AlibiAttentionSuite, causal_softmax


class TestMpt(family_suite("mpt")):
    def test_zero_queries_leave_the_alibi_bias(self) -> None:
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            attention.attention_queries = torch.zeros_like(attention.attention_queries)
            pattern = attention.attention_probabilities.save()
        bias = MODELING.build_mpt_alibi_tensor(attention.num_heads, pattern.shape[-1])
        close(pattern, causal_softmax(bias)[None], what="pattern under zero queries vs the ALiBi bias's")

    def test_queries_refuse_in_place_edits(self) -> None:
        attention = self.model.layers[0].self_attn
        with pytest.raises(RuntimeError, match="modified inplace"):
            with self.model.trace(PROMPT):
                attention.attention_queries[:] = 0

    def test_mlp_output_read_after_the_neurons_is_served(self) -> None:
        """On a fresh model, whose first trace reads down_proj's input before the dropout after it."""
        model = tiny_standardized(self.family)
        mlp = model.layers[0].mlp
        with model.trace(PROMPT):
            neurons = mlp.mlp_neurons.save()
            added = mlp.mlp_output.save()
        close(added, neurons @ mlp.down_proj._module.weight.T, what="mlp_output vs down_proj(mlp_neurons)")

    def test_decode_step_keys_and_values_are_the_steps_own(self) -> None:
        """Read before the cache update: with use_cache (MPT's config defaults to False), a decode step's own alone."""
        model = tiny_standardized(self.family, use_cache=True)
        attention = model.layers[0].self_attn
        saved: list[torch.Tensor] = []
        with model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1:2]:
                saved.extend(getattr(attention, name).save() for name in ("attention_keys", "attention_values"))
        assert [tuple(value.shape) for value in saved] == [(1, attention.num_heads, 1, attention.head_dim)] * 2


class TestMptClipped(AlibiAttentionSuite):
    """clip_qkv: the fused projection is clamped before the split, and the interior is read after the clamp."""

    family = "mpt"
    load = {"attn_config": {"clip_qkv": 0.02}}

    def test_queries_keys_values_are_read_after_the_clamp(self) -> None:
        attention = self.model.layers[0].self_attn
        parts: list[torch.Tensor] = []
        with self.model.trace(PROMPT):
            fused = attention.Wqkv.output.save()
            parts.extend(
                getattr(attention, name).save() for name in ("attention_queries", "attention_keys", "attention_values")
            )
        assert fused.abs().max() > 0.02, "the clamp is not exercised"
        for part in parts:
            assert part.abs().max().item() == pytest.approx(0.02), "a value read before the clamp"
