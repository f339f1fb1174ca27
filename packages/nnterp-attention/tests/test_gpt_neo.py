"""GPT-Neo: an attention read at its own operations, unscaled scores, and local layers attending over a window."""

import torch

from nnterp.testing import PROMPT, AttentionSuite, close, family_suite


def windowed(seq: int, window: int | None) -> torch.Tensor:
    """Which keys each query sees, [seq, seq]: the causal ones, and of those the last ``window`` where there is one."""
    seen = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
    return seen if window is None else seen & ~torch.tril(seen, -window)


class GPTNeoChecks:
    def test_layers_alternate_global_and_local(self) -> None:
        windows = [layer.self_attn.window for layer in self.model.layers]
        assert windows == [None, self.model._module.config.window_size]

    def test_scores_are_the_unscaled_product_of_queries_and_keys(self) -> None:
        for i, layer in enumerate(self.model.layers):
            attention = layer.self_attn
            with self.model.trace(PROMPT):
                queries = attention.attention_queries.save()
                keys = attention.attention_keys.save()
                scores = attention.attention_scores.save()
            seen = windowed(scores.shape[-1], attention.window)
            product = queries.float() @ keys.float().transpose(-1, -2)
            close(scores[..., seen], product[..., seen], what=f"layers[{i}] scores vs queries @ keys^T")
            assert (scores[..., ~seen] <= torch.finfo(scores.dtype).min).all(), f"layers[{i}]: a hidden key is scored"

    def test_head_outputs_project_to_the_attention_output(self) -> None:
        attention = self.model.layers[1].self_attn
        with self.model.trace(PROMPT):
            heads = attention.attention_head_outputs.save()
            output = attention.attention_output.save()
        with torch.no_grad():
            projected = attention._module.out_proj(heads.flatten(-2))
        close(projected, output, what="out_proj(head outputs) vs attention_output")

    def test_a_decode_steps_keys_include_the_cached_ones(self) -> None:
        attention = self.model.layers[0].self_attn
        seq = len(self.model.tokenizer(PROMPT).input_ids)
        saved: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[1:2]:
                saved.extend(getattr(attention, name).save() for name in ("attention_queries", "attention_keys"))
        queries, keys = saved
        assert tuple(queries.shape) == (1, attention.num_heads, 1, attention.head_dim)
        assert tuple(keys.shape) == (1, attention.num_heads, seq + 1, attention.head_dim)


class TestGPTNeo(GPTNeoChecks, family_suite("gpt_neo")):
    pass


class TestGPTNeoNarrowWindow(GPTNeoChecks, AttentionSuite):
    """A window narrower than the prompt: the local layer's queries see only their last ``window_size`` keys."""

    family = "gpt_neo"
    load = {"window_size": 4}

    def test_zero_queries_give_uniform_causal_pattern(self) -> None:
        """Zero queries give each query a uniform pattern over the keys it sees: all earlier ones, or its window."""
        for i, layer in enumerate(self.model.layers):
            attention = layer.self_attn
            with self.model.trace(PROMPT):
                attention.attention_queries = torch.zeros_like(attention.attention_queries)
                pattern = attention.attention_probabilities.save()
            seen = windowed(pattern.shape[-1], attention.window).float()
            expected = (seen / seen.sum(-1, keepdim=True)).expand_as(pattern)
            close(pattern, expected, what=f"layers[{i}] pattern under zero queries")

    def test_a_query_write_moves_its_score_row_and_a_key_write_its_column(self) -> None:
        """As on every attention, compared over the keys each query sees (a row's first key may be outside its window)."""
        for i, layer in enumerate(self.model.layers):
            attention = layer.self_attn
            with self.model.trace(PROMPT):
                clean = attention.attention_scores.save()
            position = clean.shape[-1] // 2
            seen = windowed(clean.shape[-1], attention.window)
            moved = {}
            for name in ("attention_queries", "attention_keys"):
                with self.model.trace(PROMPT):
                    written = getattr(attention, name).clone()
                    written[:, :, position] = written[:, :, position] * 3 + 1
                    setattr(attention, name, written)
                    changed = attention.attention_scores.save()
                moved[name] = ~torch.isclose(changed, clean, atol=1e-4) & seen
            rows = moved["attention_queries"].flatten(0, 1).any(0).any(-1)
            assert rows.nonzero().flatten().tolist() == [position], f"layers[{i}]: a query write moved rows {rows}"
            columns = moved["attention_keys"].flatten(0, 1).any(0).any(-2)
            assert columns.nonzero().flatten().tolist() == [position], f"layers[{i}]: a key write moved {columns}"
