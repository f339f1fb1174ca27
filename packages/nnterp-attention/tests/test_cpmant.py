"""CPM-Ant: two sub-blocks each adding to the stream, run on a learned prompt before the input, attending both ways."""

import math

import torch

from nnterp.testing import PROMPT, close, family_suite


class TestCpmAnt(family_suite("cpmant")):
    def prompt_length(self) -> int:
        return self.model._module.config.prompt_length

    def test_blocks_run_on_the_learned_prompt_then_the_input(self) -> None:
        """layers[0] starts with the prompt's embeddings; the final norm of the last block's input rows gives the logits."""
        model, length = self.model, self.prompt_length()
        with model.trace(PROMPT):
            entering = model.layers[0].layer_input.save()
            leaving = model.layers[-1].layer_output.save()
            logits = model.logits.save()
        tokens = len(model.tokenizer(PROMPT).input_ids)
        assert entering.shape[1] == leaving.shape[1] == length + tokens
        inner = model._module.cpmant
        config = model._module.config
        prompt = torch.arange(2 * length + config.vocab_size, 3 * length + config.vocab_size)[None]
        with torch.no_grad():
            expected = inner.input_embedding(prompt) + inner.segment_embedding(torch.zeros_like(prompt))
            head = model._module.lm_head(inner.encoder.output_layernorm(leaving)[:, length:])
        close(entering[:, :length], expected, what="layers[0].layer_input's first rows vs the prompt's embeddings")
        close(head, logits, what="lm_head(ln_final(last layer_output)) past the prompt vs logits")

    def test_scores_are_the_scaled_products_plus_the_relative_position_bias(self) -> None:
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            bias = attention.inputs[0][3].save()  # the block hands the model's position bias on, fourth
            queries = attention.attention_queries.save()
            keys = attention.attention_keys.save()
            scores = attention.attention_scores.save()
        expected = queries @ keys.transpose(-1, -2) / math.sqrt(attention.head_dim) + bias
        close(scores, expected, what="scores vs q.k / sqrt(head_dim) + position bias")

    def test_zero_queries_leave_the_softmax_of_the_bias_over_every_key(self) -> None:
        """The first forward masks nothing (no pad): zero queries give each row the softmax of its bias row, both ways."""
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            bias = attention.inputs[0][3].save()
            attention.attention_queries = torch.zeros_like(attention.attention_queries)
            pattern = attention.attention_probabilities.save()
        close(pattern, torch.softmax(bias, dim=-1), what="pattern under zero queries vs softmax(position bias)")
        assert pattern[..., 0, 1:].sum() > 0, "the first position attends to no later one"
