import math

import pytest
import torch
from transformers.models.falcon import modeling_falcon as MODELING

from nnterp import Unavailable
from nnterp.testing import PROMPT, AttentionSuite, LayerSuite, Suite, close, family_suite, tiny_standardized
from nnterp_attention import NOT_EAGER
from nnterp_attention.families.falcon import FLASH, FUSED, PARALLEL_BLOCK
from nnterp_attention.testing import AlibiAttentionSuite

INTERIOR = ("attention_queries", "attention_keys", "attention_values", "attention_head_outputs")
#: Whether the installed forward computes its pattern itself (before transformers 5.25), told apart here by its
#: helper rather than as the family tells: it adds ALiBi to the logits as well as through the mask, repeats the new
#: architecture's keys for their query group, and under sdpa materializes all but the scores and the pattern.
OWN_ARITHMETIC = hasattr(MODELING.FalconAttention, "_split_heads")


def linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What a ``FalconLinear`` computes, ``x @ W.T + b``."""
    out = x @ module.weight.T
    return out if module.bias is None else out + module.bias


class FalconSuite(Suite):
    """What every Falcon block shape must have beyond the suites: the ALiBi-or-rotary pattern, the MLP's own output."""

    def test_pattern_is_recomputed_from_queries_and_keys(self) -> None:
        """(q k^T + ALiBi) / sqrt(head_dim) (folded into the mask) + the causal mask, and the pattern its softmax.

        A forward computing its pattern itself adds ALiBi a second time, to the logits before they are scaled.
        """
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            queries = attention.attention_queries.save()
            keys = attention.attention_keys.save()
            scores = attention.attention_scores.save()
            pattern = attention.attention_probabilities.save()
        heads, seq = attention.num_heads, queries.shape[-2]
        logits = queries @ keys.repeat_interleave(heads // keys.shape[1], dim=1).transpose(-1, -2)
        if self.model._module.config.alibi:
            bias = MODELING.build_alibi_tensor(torch.ones(1, seq), heads, torch.float32).view(1, heads, 1, seq)
            logits = logits + (2 if OWN_ARITHMETIC else 1) * bias
        logits = logits / math.sqrt(attention.head_dim)
        causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
        close(scores[..., causal], logits[..., causal], what="served scores vs recomputed, on the causal keys")
        expected = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
        close(pattern, expected, what="served pattern vs softmax of the recomputed scores")

    def test_head_outputs_through_dense_are_attention_output(self) -> None:
        attention = self.model.layers[0].self_attn
        with self.model.trace(PROMPT):
            heads = attention.attention_head_outputs.save()
            output = attention.attention_output.save()
        close(linear(attention._module.dense, heads.flatten(2)), output, what="dense(head outputs) vs attention_output")

    def test_mlp_output_is_the_mlps_own(self) -> None:
        """A parallel block adds the attention into the MLP's output in place: what was read must not change."""
        layer = self.model.layers[0]
        mlp = layer.mlp._module
        with self.model.trace(PROMPT):
            normed = layer.mlp_norm_output.save()
            activation = layer.mlp.mlp_activation.save()
            neurons = layer.mlp.mlp_neurons.save()
            output = layer.mlp.mlp_output.save()
        close(activation, mlp.act(linear(mlp.dense_h_to_4h, normed)), what="mlp_activation vs act(h_to_4h(normed))")
        close(neurons, activation, what="mlp_neurons vs mlp_activation")
        close(output, linear(mlp.dense_4h_to_h, neurons), what="mlp_output vs 4h_to_h(neurons): the MLP's own")

    def test_mlp_output_writes_reach_the_model_and_stay_the_users(self) -> None:
        """An in-place edit and an assignment both reach layer_output; neither tensor takes the block's addition."""
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            entering = layer.layer_input.save()
            attention = layer.self_attn.attention_output.save()
            layer.mlp.mlp_output[:, -1] = 0
            edited = layer.mlp.mlp_output.save()
            edited_output = layer.layer_output.save()
        with self.model.trace(PROMPT):
            zeros = torch.zeros_like(layer.mlp.mlp_output).save()
            layer.mlp.mlp_output = zeros
            assigned_output = layer.layer_output.save()
        assert torch.count_nonzero(edited[:, -1]) == 0, "the edited mlp_output took the attention's output"
        close(edited_output[:, -1], (entering + attention)[:, -1], what="layer_output after zeroing mlp_output[:, -1]")
        assert torch.count_nonzero(zeros) == 0, "the assigned tensor took the attention's output"
        close(assigned_output, entering + attention, what="layer_output after assigning zeros to mlp_output")

    def test_decode_step_keys_and_values_include_the_cached_ones(self) -> None:
        seq = len(self.model.tokenizer(PROMPT).input_ids)
        attention = self.model.layers[0].self_attn
        saved: list[torch.Tensor] = []
        with self.model.generate(PROMPT, max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:
            for _ in tracer.iter[0:2]:
                saved.extend(getattr(attention, name).save() for name in ("attention_keys", "attention_values"))
        prompt_keys, _, step_keys, step_values = saved
        kv_heads, head_dim = attention.num_kv_heads, attention.head_dim
        assert [tuple(v.shape) for v in (step_keys, step_values)] == [(1, kv_heads, seq + 1, head_dim)] * 2
        close(step_keys[:, :, :seq], prompt_keys, what="the decode step's cached keys vs the prompt's")

    def test_sdpa_through_the_interface_is_eager_attention_without_the_interior(self) -> None:
        """Through the attention interface sdpa computes eager's attention, ALiBi included; the interior raises."""
        if OWN_ARITHMETIC:
            pytest.skip("this forward computes its pattern itself: see test_sdpa_serves_what_it_materializes")
        model = tiny_standardized(self.family, **{**self.load, "attn_implementation": "sdpa"})
        reason = NOT_EAGER.format(implementation="sdpa")
        support = model.support()
        for name in (*INTERIOR, "attention_scores", "attention_probabilities"):
            assert support[f"self_attn.{name}"] == dict.fromkeys(range(model.num_layers), reason), name
        with pytest.raises(Unavailable, match=r"attn_implementation='sdpa'.*attn_implementation='eager'"):
            with model.trace(PROMPT):
                model.layers[0].self_attn.attention_queries.save()
        outputs = []
        for which in (self.model, model):
            with which.trace(PROMPT):
                outputs.append(which.layers[-1].self_attn.attention_output.save())
        close(outputs[1], outputs[0], what="attention_output under sdpa vs eager")

    def test_sdpa_serves_what_it_materializes(self) -> None:
        """Under sdpa: queries, keys and values as under eager, head outputs mixing them; scores and pattern raise.

        The head outputs are recomputed from the served queries, keys and values with the bias sdpa gets: ALiBi
        once, through the mask (eager adds it twice, so under ALiBi the two implementations differ).
        """
        if not OWN_ARITHMETIC:
            pytest.skip("this forward calls the attention interface: see the test of sdpa through the interface")
        model = tiny_standardized(self.family, **{**self.load, "attn_implementation": "sdpa"})
        support = model.support()
        for name in ("attention_scores", "attention_probabilities"):
            assert support[f"self_attn.{name}"] == dict.fromkeys(range(model.num_layers), FUSED), name
            with pytest.raises(Unavailable, match=r"scaled_dot_product_attention.*attn_implementation='eager'"):
                with model.trace(PROMPT):
                    getattr(model.layers[0].self_attn, name).save()
        assert all(support[f"self_attn.{name}"] is None for name in INTERIOR)
        read: dict[bool, list[torch.Tensor]] = {}
        for which in (self.model, model):
            attention = which.layers[0].self_attn
            with which.trace(PROMPT):
                read[which is model] = [getattr(attention, name).save() for name in INTERIOR]
        for name, eager, sdpa in zip(INTERIOR[:3], read[False][:3], read[True][:3], strict=True):
            close(sdpa, eager, what=f"{name} under sdpa vs eager")
        queries, keys, values, heads = read[True]
        groups = queries.shape[1] // keys.shape[1]
        logits = (queries @ keys.repeat_interleave(groups, dim=1).transpose(-1, -2)) / math.sqrt(queries.shape[-1])
        seq = logits.shape[-1]
        if model._module.config.alibi:
            bias = MODELING.build_alibi_tensor(torch.ones(1, seq), queries.shape[1], torch.float32)
            logits = logits + bias.view(1, -1, 1, seq) / math.sqrt(queries.shape[-1])
        causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
        pattern = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
        expected = (pattern @ values.repeat_interleave(groups, dim=1)).transpose(1, 2)
        close(heads, expected, what="head outputs under sdpa vs softmax(q k^T / sqrt(d) + bias) v")


class ParallelBlock:
    def test_parallel_block_has_no_layer_mid(self) -> None:
        support = self.model.support()
        assert support["layer_mid"] == dict.fromkeys(range(self.model.num_layers), PARALLEL_BLOCK)
        assert "parallel block" in PARALLEL_BLOCK and "attention_norm_output" in PARALLEL_BLOCK
        with pytest.raises(Unavailable, match="parallel block"):
            with self.model.trace(PROMPT):
                self.model.layers[0].layer_mid.save()


class TestFalcon40B(LayerSuite, AttentionSuite, FalconSuite, ParallelBlock):
    """The new decoder architecture: a parallel block with a norm per sublayer, grouped keys repeated as split."""

    family = "falcon"
    load = {"new_decoder_architecture": True, "num_kv_heads": 2}

    def test_each_sublayer_reads_its_own_norm(self) -> None:
        layer = self.model.layers[0]
        block = layer._module
        # Fresh norms are all the identity: give the MLP's weights of its own, so reading the other norm shows.
        weight = block.ln_mlp.weight.detach().clone()
        try:
            with torch.no_grad():
                block.ln_mlp.weight.mul_(2)
            with self.model.trace(PROMPT):
                entering = layer.layer_input.save()
                attention_normed = layer.attention_norm_output.save()
                mlp_normed = layer.mlp_norm_output.save()
            with torch.no_grad():
                close(attention_normed, block.ln_attn(entering), what="attention_norm_output vs ln_attn(layer_input)")
                close(mlp_normed, block.ln_mlp(entering), what="mlp_norm_output vs ln_mlp(layer_input)")
        finally:
            with torch.no_grad():
                block.ln_mlp.weight.copy_(weight)

    def test_keys_come_with_num_kv_heads(self) -> None:
        """One key head per group through the interface; a forward computing its pattern itself repeats it per query head."""
        attention = self.model.layers[0].self_attn
        (keys,) = self.read(0, "attention_keys")
        expected = attention.num_heads if OWN_ARITHMETIC else attention._module.num_kv_heads
        assert attention.num_kv_heads == keys.shape[1] == expected
        if OWN_ARITHMETIC:
            close(keys[:, 0], keys[:, 1], what="the two query heads of one group get the same key")
        else:
            assert not torch.allclose(keys[:, 0], keys[:, 1]), "the two groups got the same key"


class TestFalcon7B(family_suite("falcon", AlibiAttentionSuite), FalconSuite, ParallelBlock):
    """parallel_attn with one norm and multi_query: both sublayers are called with input_layernorm's output."""

    def test_flash_attention_is_reported_unread(self) -> None:
        """Flash attention runs no eager arithmetic this family reads: every interior value says so, rather than waiting."""
        model = tiny_standardized(self.family)
        model._module.config._attn_implementation = "flash_attention_2"
        reason = (FLASH if OWN_ARITHMETIC else NOT_EAGER).format(implementation="flash_attention_2")
        support = model.support()
        for name in (*INTERIOR, "attention_scores", "attention_probabilities"):
            assert support[f"self_attn.{name}"] == dict.fromkeys(range(model.num_layers), reason), name

    def test_the_mlp_reads_the_attentions_norm(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            attention_normed = layer.attention_norm_output.save()
            mlp_normed = layer.mlp_norm_output.save()
        close(mlp_normed, attention_normed, what="mlp_norm_output vs attention_norm_output")
        assert self.model.layers[0].self_attn.num_kv_heads == 1


class TestFalconRW(LayerSuite, AlibiAttentionSuite, FalconSuite):
    """Sequential with ALiBi: the stream between the sublayers exists, and the pattern carries the bias."""

    family = "falcon"
    # By path Falcon loads under sdpa, which materializes no pattern: load eager.
    load = {"parallel_attn": False, "alibi": True, "multi_query": False, "bias": True, "attn_implementation": "eager"}

    def test_sequential_block_has_layer_mid(self) -> None:
        assert self.model.support()["layer_mid"] is None
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            mid = layer.layer_mid.save()
            normed = layer.mlp_norm_output.save()
        close(normed, layer.post_attention_layernorm._module(mid), what="mlp_norm_output vs the norm of layer_mid")
