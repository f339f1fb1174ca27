"""LongCat-Flash: two attention + MLP pairs per block, and a shortcut mixture of experts with identity experts."""

import inspect

import pytest
import torch
from transformers.models.longcat_flash import modeling_longcat_flash as MODELING

from nnterp import OrderError, StandardizedTransformer, Unavailable
from nnterp.testing import PROMPT, MoeSuite, close, draw_selection_bias, family_suite
from nnterp_attention.families.longcat_flash import IDENTITY_INSIDE_EXPERTS

#: Whether the installed mixture computes its identity slots' sum apart from the experts (transformers 5.25 on).
IDENTITY_APART = "identity_output" in inspect.getsource(MODELING.LongcatFlashMoE.forward)


def routed_by_token(model: StandardizedTransformer) -> StandardizedTransformer:
    """``model`` with its routers drawn at a scale where tokens choose different experts, and a selection bias.

    A random router's logits are within a hair of each other, so every token
    would choose alike (and the identity experts always or never); a
    checkpoint's selection bias is learned, where the tiny model's is zero.
    """
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model._module.model.layers:
            classifier = layer.mlp.router.classifier.weight
            classifier.copy_(torch.randn(classifier.shape, generator=generator) * 0.3)
    return draw_selection_bias(model, 0.05)


def mixture_by_hand(mlp, entering: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The mixture recomputed slot by slot: expert ``e`` on the token, or the token itself past ``num_experts``, weighted."""
    experts = mlp.experts_module()
    total = torch.zeros_like(entering)
    with torch.no_grad():
        for slot in range(indices.shape[-1]):
            for expert in indices[..., slot].unique().tolist():
                rows = indices[..., slot] == expert
                x = entering[rows]
                if expert < mlp.num_experts:
                    gate, up = torch.nn.functional.linear(x, experts.gate_up_proj[expert]).chunk(2, dim=-1)
                    out = torch.nn.functional.linear(experts.act_fn(gate) * up, experts.down_proj[expert])
                else:
                    out = x
                total[rows] += out * weights[..., slot][rows, None].to(out.dtype)
    return total


class TestLongcatFlash(family_suite("longcat_flash")):
    """The suites ``nnterp check`` runs (layer, attention, mixture of experts), and the block's own identities."""

    @classmethod
    def build_model(cls):
        return routed_by_token(super().build_model())

    def read_block(self, index: int) -> dict[str, torch.Tensor]:
        """Every boundary and contribution of block ``index``, in one trace, in the forward's order."""
        layer = self.model.layers[index]
        read: dict[str, torch.Tensor] = {}
        with self.model.trace(PROMPT):
            read["layer_input"] = layer.layer_input.save()
            read["attention_norm_output"] = layer.attention_norm_output.save()
            read["attn0"] = layer.self_attn.attention_output.save()
            read["layer_mid"] = layer.layer_mid.save()
            read["mlp_norm_output"] = layer.mlp_norm_output.save()
            read["mlp_input"] = layer.mlp_input.save()
            read["moe"] = layer.mlp.mlp_output.save()
            read["dense_input"] = layer.dense_mlp.input.save()
            read["mlp0"] = layer.dense_mlp.mlp_output.save()
            read["second_input"] = layer.second_input.save()
            read["second_attention_norm_output"] = layer.second_attention_norm_output.save()
            read["attn1"] = layer.second_attn.attention_output.save()
            read["second_mid"] = layer.second_mid.save()
            read["second_mlp_norm_output"] = layer.second_mlp_norm_output.save()
            read["mlp1"] = layer.second_dense_mlp.mlp_output.save()
            read["layer_output"] = layer.layer_output.save()
        return read

    # -- the block -----------------------------------------------------------------------

    def test_blocks_are_the_config_num_layers_each_with_two_attentions(self) -> None:
        config = self.model._module.config
        assert self.model.num_layers == config.num_layers == len(self.model._module.model.layers)
        assert config.num_hidden_layers == 2 * config.num_layers
        for index, layer in enumerate(self.model.layers):
            block = layer._module
            assert layer.self_attn._module is block.self_attn[0]
            assert layer.second_attn._module is block.self_attn[1]
            assert layer.dense_mlp._module is block.mlps[0]
            assert layer.second_dense_mlp._module is block.mlps[1]
            assert layer.mlp._module is block.mlp
            # the two attentions are the model's attention layers 2i and 2i + 1, each with its own cache slot
            assert (block.self_attn[0].layer_idx, block.self_attn[1].layer_idx) == (2 * index, 2 * index + 1)

    def test_the_first_attention_goes_by_the_standard_name(self) -> None:
        """``self_attn`` is listed and named as the block's attention, though transformers' ``self_attn`` is the pair."""
        support = self.model.support()
        for value in ("attention_probabilities", "attention_output"):
            assert support[f"self_attn.{value}"] is None and support[f"second_attn.{value}"] is None
        with pytest.raises(OrderError, match=r"on layers\[0\]\.self_attn was asked"), self.model.trace(PROMPT):
            self.model.layers[0].second_attn.attention_output.save()
            self.model.layers[0].self_attn.attention_output.save()

    def test_the_five_contributions_add_up_each_at_its_place(self) -> None:
        """layer_output = layer_input + attn0 + mlp0 + attn1 + mlp1 + moe, the mixture's added last."""
        for index in range(self.model.num_layers):
            read = self.read_block(index)
            what = f"layers[{index}]"
            close(read["layer_input"] + read["attn0"], read["layer_mid"], what=f"{what}: layer_mid")
            close(read["layer_mid"] + read["mlp0"], read["second_input"], what=f"{what}: second_input (no mixture)")
            close(read["second_input"] + read["attn1"], read["second_mid"], what=f"{what}: second_mid")
            close(read["second_mid"] + read["mlp1"] + read["moe"], read["layer_output"], what=f"{what}: layer_output")
            parts = ("attn0", "mlp0", "attn1", "mlp1", "moe")
            for name in parts:
                assert read[name].abs().max() > 1e-3, f"{what}: {name} is too small to show"
            close(
                read["layer_input"] + sum(read[name] for name in parts),
                read["layer_output"],
                what=f"{what}: the five contributions",
            )

    def test_the_mixture_and_the_first_dense_mlp_read_the_first_mlps_norm(self) -> None:
        for index, layer in enumerate(self.model.layers):
            read = self.read_block(index)
            block = layer._module
            with torch.no_grad():
                normed = block.post_attention_layernorm[0](read["layer_mid"])
                second_normed = block.post_attention_layernorm[1](read["second_mid"])
                attention_normed = block.input_layernorm[0](read["layer_input"])
                second_attention_normed = block.input_layernorm[1](read["second_input"])
            what = f"layers[{index}]"
            close(read["mlp_norm_output"], normed, what=f"{what}: mlp_norm_output vs post_attention_layernorm[0]")
            close(read["mlp_input"], normed, what=f"{what}: the mixture's input")
            close(read["dense_input"], normed, what=f"{what}: the first dense MLP's input")
            close(read["second_mlp_norm_output"], second_normed, what=f"{what}: second_mlp_norm_output")
            close(read["attention_norm_output"], attention_normed, what=f"{what}: attention_norm_output")
            close(read["second_attention_norm_output"], second_attention_normed, what=f"{what}: second attention's")
            assert not torch.allclose(read["mlp_input"], second_normed, atol=1e-3), "the norms agree: nothing checked"

    def test_a_write_to_mlp_norm_output_reaches_the_mixture_and_the_dense_mlp(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            written = torch.randn_like(layer.mlp_norm_output).save()
            layer.mlp_norm_output = written
            moe_input = layer.mlp_input.save()
            dense_input = layer.dense_mlp.input.save()
        close(moe_input, written, what="the mixture's input after writing mlp_norm_output")
        close(dense_input, written, what="the first dense MLP's input after writing mlp_norm_output")

    def test_assigned_second_streams_reach_the_norm_and_the_residual(self) -> None:
        """second_input and second_mid are each held twice, as a norm's input and as the residual: a write reaches both."""
        layer = self.model.layers[0]
        for name, after in (
            ("second_input", (("second_attn", "attention_output"), ("second_dense_mlp", "mlp_output"))),
            ("second_mid", (("second_dense_mlp", "mlp_output"),)),
        ):
            parts: list[torch.Tensor] = []  # bound outside: a name first bound inside a trace does not survive it
            with self.model.trace(PROMPT):
                moe = layer.mlp.mlp_output.save()
                current = getattr(layer, name)
                written = (torch.randn_like(current) * current.std()).save()
                setattr(layer, name, written)
                parts.extend(getattr(getattr(layer, module), value).save() for module, value in after)
                leaving = layer.layer_output.save()
            close(written + sum(parts) + moe, leaving, what=f"layer_output after assigning {name}")

    # -- the second attention ------------------------------------------------------------

    def test_the_second_attention_serves_its_interior(self) -> None:
        for index, layer in enumerate(self.model.layers):
            attention = layer.second_attn
            with self.model.trace(PROMPT):
                first = layer.self_attn.attention_probabilities.save()
                entering = layer.second_attention_norm_output.save()
                queries = attention.attention_queries.save()
                keys = attention.attention_keys.save()
                values = attention.attention_values.save()
                scores = attention.attention_scores.save()
                pattern = attention.attention_probabilities.save()
                heads = attention.attention_head_outputs.save()
                output = attention.attention_output.save()
            what = f"layers[{index}].second_attn"
            seq = entering.shape[1]
            assert queries.shape == keys.shape == (1, attention.num_heads, seq, attention.qk_head_dim)
            assert values.shape == (1, attention.num_kv_heads, seq, attention.head_dim)
            module = attention._module
            close(scores, (queries @ keys.transpose(-1, -2)) * module.scaling + causal_mask(seq), what=f"{what} scores")
            close(pattern, torch.softmax(scores, dim=-1), what=f"{what} pattern")
            close(heads, (pattern @ values).transpose(1, 2), what=f"{what} head outputs")
            with torch.no_grad():
                close(output, module.o_proj(heads.flatten(2)), what=f"{what} output vs o_proj(heads)")
            assert not torch.allclose(pattern, first, atol=1e-4), "the two attentions' patterns agree"

    def test_a_write_to_the_second_attention_changes_its_contribution_only(self) -> None:
        layer = self.model.layers[0]
        with self.model.trace(PROMPT):
            first = layer.self_attn.attention_output.save()
            clean = layer.second_attn.attention_output.save()
        with self.model.trace(PROMPT):
            unchanged = layer.self_attn.attention_output.save()
            layer.second_attn.attention_queries = torch.zeros_like(layer.second_attn.attention_queries)
            pattern = layer.second_attn.attention_probabilities.save()
            edited = layer.second_attn.attention_output.save()
        close(unchanged, first, what="the first attention's output")
        seq = pattern.shape[-1]
        causal = torch.tril(torch.ones(seq, seq))
        close(pattern, (causal / causal.sum(-1, keepdim=True)).expand_as(pattern), what="uniform pattern")
        assert not torch.allclose(edited, clean), "zero queries left the second attention's output"

    # -- the mixture's identity experts --------------------------------------------------

    def read_routing(self, index: int = 0) -> dict[str, torch.Tensor]:
        mlp = self.model.layers[index].mlp
        read: dict[str, torch.Tensor] = {}  # bound outside: a name first bound inside a trace does not survive it
        with self.model.trace(PROMPT):
            read["entering"] = self.model.layers[index].mlp_input.save()
            read["indices"] = mlp.expert_indices.save()
            read["weights"] = mlp.expert_weights.save()
            read["routed"] = mlp.routed_output.save()
            read["output"] = mlp.mlp_output.save()
        return read

    def test_the_routing_runs_over_the_routed_and_the_identity_experts(self) -> None:
        for index in self.moe_layers():
            mlp = self.model.layers[index].mlp
            assert mlp.num_experts == self.model._module.config.n_routed_experts
            assert mlp.zero_expert_num == self.model._module.config.zero_expert_num > 0
            assert mlp.router_classes == mlp.num_experts + mlp.zero_expert_num
            read = self.read_routing(index)
            identity = read["indices"] >= mlp.num_experts
            assert identity.any() and not identity.all(), (
                f"layers[{index}]: every slot or none chose an identity expert"
            )
            assert int(read["indices"].max()) < mlp.router_classes
            close(read["routed"], read["output"], what=f"layers[{index}]: routed_output is the mixture's output")

    def test_the_mixture_is_its_slots_identity_experts_giving_the_token(self) -> None:
        for index in self.moe_layers():
            mlp = self.model.layers[index].mlp
            read = self.read_routing(index)
            expected = mixture_by_hand(mlp, read["entering"], read["indices"], read["weights"])
            close(read["routed"], expected, what=f"layers[{index}]: the mixture vs its slots by hand")

    def test_routing_every_slot_to_an_identity_expert_gives_the_weighted_token(self) -> None:
        mlp = self.model.layers[0].mlp
        with self.model.trace(PROMPT):
            entering = self.model.layers[0].mlp_input.save()
            indices = mlp.expert_indices
            written = torch.full_like(indices, mlp.num_experts)
            written[..., 1:] = mlp.num_experts + 1
            mlp.expert_indices = written
            weights = mlp.expert_weights.save()
            routed = mlp.routed_output.save()
        close(routed, entering * weights.sum(-1, keepdim=True), what="the mixture with every slot an identity expert")

    def test_identity_output_where_the_mixture_computes_it_apart(self) -> None:
        mlp = self.model.layers[0].mlp
        if not IDENTITY_APART:
            assert mlp.support()["identity_output"] == IDENTITY_INSIDE_EXPERTS
            with pytest.raises(Unavailable, match="identity_output"), self.model.trace(PROMPT):
                mlp.identity_output.save()
            return
        with self.model.trace(PROMPT):
            entering = self.model.layers[0].mlp_input.save()
            indices = mlp.expert_indices.save()
            weights = mlp.expert_weights.save()
            identity = mlp.identity_output.save()
            routed = mlp.routed_output.save()
        chosen = weights.masked_fill(indices < mlp.num_experts, 0).sum(-1, keepdim=True)
        close(identity, entering * chosen, what="identity_output vs the token times its identity slots' weights")
        with self.model.trace(PROMPT):
            mlp.identity_output = torch.zeros_like(mlp.identity_output)
            silenced = mlp.routed_output.save()
        close(silenced, routed - identity, what="the mixture with identity_output zeroed")

    def test_expert_outputs_say_why_no_tensor_holds_the_slots(self) -> None:
        reason = self.model.layers[0].mlp.support()["expert_outputs"]
        assert reason is not None and "routed_output" in reason, reason


def causal_mask(seq: int) -> torch.Tensor:
    """The additive causal mask: zero on and below the diagonal, the float minimum above."""
    return torch.full((seq, seq), torch.finfo(torch.float32).min).triu(1)


class TestLongcatFlashWithoutIdentityExperts(MoeSuite):
    """``zero_expert_num=0``: a plain mixture, whose slots transformers' grouped_mm experts hold from 5.25 on."""

    family = "longcat_flash"
    load = {"zero_expert_num": 0}

    @classmethod
    def build_model(cls):
        return routed_by_token(super().build_model())

    def test_the_router_scores_the_routed_experts_alone(self) -> None:
        mlp = self.model.layers[0].mlp
        assert mlp.zero_expert_num == 0 and mlp.router_classes == mlp.num_experts
        assert "no identity experts" in mlp.support()["identity_output"]
        # the release that computes the identity slots apart (5.25) also runs its experts through grouped_mm
        slots = mlp.support()["expert_outputs"]
        assert (slots is None) == IDENTITY_APART, slots
