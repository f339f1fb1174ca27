import torch

from nnterp import StandardizedTransformer
from nnterp.testing import PROMPT, close, draw_selection_bias, family_suite, tiny_standardized
from nnterp_attention.testing import sink_softmax

#: Rates at which ``PROMPT`` compresses: four windows of four tokens, two of eight.
RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}


class TestDeepseekV4(family_suite("deepseek_v4")):
    @classmethod
    def build_model(cls) -> StandardizedTransformer:
        return draw_selection_bias(super().build_model(), 0.05)

    def test_the_final_norm_reads_the_streams_weighted_by_the_head(self) -> None:
        with self.model.trace(PROMPT):
            leaving = self.model.layers[-1].layer_output.save()
            final = self.model.ln_final.input.save()
        with torch.no_grad():
            collapsed = self.model._module.model.hc_head(leaving)
        close(final, collapsed, what="the final norm's input vs hc_head of the last block's streams")
        assert not torch.allclose(final, leaving.mean(dim=-2)), "hc_head weighs the streams equally"

    def test_every_stream_starts_as_the_token_embedding(self) -> None:
        with self.model.trace(PROMPT):
            embeddings = self.model.embed_tokens.output.save()
            entering = self.model.layers[0].layer_input.save()
        close(entering, embeddings.unsqueeze(-2).expand_as(entering), what="each stream entering layers[0]")

    def test_keys_and_values_are_one_tensor(self) -> None:
        """An in-place edit of the values edits the keys, which are the same tensor; an assignment replaces the values alone."""
        attention = self.model.layers[0].self_attn
        (clean,) = self.read(0, "attention_scores")
        with self.model.trace(PROMPT):
            attention.attention_values[:, :, 3] = 0
            edited = attention.attention_scores.save()
        with self.model.trace(PROMPT):
            attention.attention_values = torch.zeros_like(attention.attention_values)
            assigned = attention.attention_scores.save()
        assert torch.all(edited[:, :, 3:, 3] == 0), "zeroing value 3 in place left key 3's scores"
        close(assigned, clean, what="scores after the values were assigned")

    def test_compressed_entries_follow_the_tokens_on_the_key_axis(self) -> None:
        """On a prompt long enough to compress, the keys are the tokens then the compressor's entries, attended causally.

        An entry summarizes a window of ``rate`` tokens: a query sees it once the window is complete, and on a
        compressed sparse block only where the indexer keeps it.
        """
        model = tiny_standardized(self.family, compress_rates=RATES)
        seq = len(model.tokenizer(PROMPT).input_ids)
        for layer, rate in ((1, 4), (2, 8)):
            attention = model.layers[layer].self_attn
            with model.trace(PROMPT):  # a trace of its own: read first, a child's output unsets the parent's source
                entries = attention.compressor.output[0].save()
            with model.trace(PROMPT):
                keys = attention.attention_keys.save()
                values = attention.attention_values.save()
                scores = attention.attention_scores.save()
                pattern = attention.attention_probabilities.save()
                heads = attention.attention_head_outputs.save()
            count = seq // rate
            assert keys.shape[2] == pattern.shape[-1] == seq + count, f"layers[{layer}]: keys {tuple(keys.shape)}"
            close(keys[:, :, seq:], entries, what=f"layers[{layer}] keys after the tokens vs the compressor's entries")
            close(pattern, sink_softmax(scores, attention.sink_logits)[..., :-1], what=f"layers[{layer}] pattern")
            repeated = values.expand(-1, attention.num_heads, -1, -1)
            close(heads, (pattern @ repeated).transpose(1, 2), what=f"layers[{layer}] head outputs")
            complete = (torch.arange(seq) + 1) // rate  # the entries each query may see
            unseen = torch.arange(count) >= complete.unsqueeze(-1)
            assert pattern[..., seq:][..., unseen].abs().max() == 0, f"layers[{layer}]: an entry is seen early"
            seen = pattern[..., seq:] > 0
            assert seen.any(), f"layers[{layer}]: no query attends to an entry"
        kept = seen.sum(-1)  # the heavily compressed block keeps every complete entry
        assert torch.equal(kept, complete.expand_as(kept)), f"layers[2] entries seen per query: {kept}"

    def test_an_indexed_block_sees_only_the_entries_its_indexer_keeps(self) -> None:
        model = tiny_standardized(self.family, compress_rates=RATES, index_topk=1)
        seq = len(model.tokenizer(PROMPT).input_ids)
        attention = model.layers[1].self_attn
        with model.trace(PROMPT):
            chosen = attention.compressor.indexer.output.save()
        with model.trace(PROMPT):
            pattern = attention.attention_probabilities.save()
        seen = pattern[0, :, :, seq:] > 0
        expected = torch.zeros_like(seen[0])
        valid = chosen[0, :, 0] >= 0
        expected[valid.nonzero().flatten(), chosen[0, valid, 0]] = True
        assert torch.equal(seen, expected.expand_as(seen)), "the queries see other entries than the indexer's choice"
        # a query with a complete window keeps one entry of the several complete by the end, one without keeps none
        assert torch.equal(valid, (torch.arange(seq) + 1) // 4 > 0), f"queries with an entry: {valid}"

    def test_a_hash_block_routes_by_the_token_table_whatever_the_logits(self) -> None:
        model = tiny_standardized(self.family, mlp_layer_types=["hash_moe", "moe", "moe"])
        mlp = model.layers[0].mlp
        router = model._module.model.layers[0].mlp.gate
        generator = torch.Generator().manual_seed(0)
        table = torch.rand(router.tid2eid.shape[0], mlp.num_experts, generator=generator).argsort(-1)[:, : mlp.top_k]
        router.tid2eid.copy_(table)
        ids = model.tokenizer(PROMPT, return_tensors="pt").input_ids
        with model.trace(PROMPT):
            mlp.router_logits = torch.zeros_like(mlp.router_logits)
            indices = mlp.expert_indices.save()
            weights = mlp.expert_weights.save()
        assert torch.equal(indices[0], table[ids[0]]), "a hash block's experts are not its tokens' table rows"
        equal = torch.full_like(weights, router.routed_scaling_factor / mlp.top_k)
        close(weights, equal, what="weights of equal logits: the scaled share of each chosen expert")
