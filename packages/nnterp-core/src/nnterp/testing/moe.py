"""The mixture-of-experts suite: routing reproduced from the served logits, the slots adding up, and writes that reroute.

Mixed into a family's test class beside the layer suite, for every family
whose blocks hold a :class:`~nnterp.Moe`. The model is built with the family's
default experts implementation (``grouped_mm``), where every value is served.
"""

from __future__ import annotations

import unittest
from typing import Any

import torch

from ..availability import Unavailable
from ..components.moe import Moe
from ..components.standard import axis_size
from ..order import OrderError
from .models import tiny_standardized
from .suites import ATOL, PROMPT, Suite, close, raises

#: Prompts of different lengths, for the left-padded batch and the two-invoke trace.
BATCH = ("Hello world, there", "A much longer prompt than the first one, with more tokens")
#: Decode steps the generate check takes.
STEPS = 3
ROUTING = ("router_logits", "expert_weights", "expert_indices")


def by_expert(indices: torch.Tensor, *slotted: torch.Tensor) -> list[torch.Tensor]:
    """``indices`` and each tensor of ``slotted`` with the slots (axis 2) put in expert order, for comparing routings."""
    order = indices.argsort(-1)
    return [indices.gather(-1, order)] + [
        tensor.gather(2, order.view(*order.shape, *[1] * (tensor.dim() - 3)).expand_as(tensor)) for tensor in slotted
    ]


def draw_selection_bias(model: Any, scale: float, bias: str = "e_score_correction_bias") -> Any:
    """``model`` with each mixture router's selection bias (its buffer ``bias``) drawn at random, ``scale`` times a normal.

    A checkpoint's bias is learned; a tiny model's starts at zero, where a
    reference routing that ignored it would still agree with the model. The
    buffer is found on the router, not through the family's ``SCORING``, so a
    family that forgets to declare its bias is caught.
    """
    generator = torch.Generator().manual_seed(0)
    for layer in model.layers:
        mlp = getattr(layer, "mlp", None)
        if isinstance(mlp, Moe):
            drawn = getattr(mlp.router_module(), bias)
            drawn.copy_(torch.randn(drawn.shape, generator=generator) * scale)
    return model


class MoeSuite(Suite):
    """Properties of a mixture of experts' values, on every block whose MLP runs one."""

    def moe_layers(self) -> list[int]:
        layers = [
            i
            for i, layer in enumerate(self.model.layers)
            if isinstance(getattr(layer, "mlp", None), Moe) and layer.mlp.no_mixture() is None
        ]
        assert layers, f"{self.family}: no block runs a mixture of experts"
        return layers

    def read_moe(self, prompt: Any, *names: str, **kwargs: Any) -> list[dict[str, torch.Tensor]]:
        """Each mixture block's ``names`` (those available) on ``prompt``, read in the forward's order."""
        found: list[dict[str, torch.Tensor]] = []
        with self.model.trace(prompt, **kwargs):
            for layer in self.moe_layers():
                mlp = self.model.layers[layer].mlp
                support = mlp.support()
                found.append({name: getattr(mlp, name).save() for name in names if support[name] is None})
        return found

    def moe_serves(self, name: str) -> bool:
        return self.model.layers[self.moe_layers()[0]].mlp.support()[name] is None

    # -- identities ------------------------------------------------------------

    def test_routing_sizes_match_served_shapes(self) -> None:
        names = ("router_logits", "expert_weights", "expert_indices", "expert_outputs", "routed_output")
        for layer, values in zip(self.moe_layers(), self.read_moe(PROMPT, *names), strict=True):
            mlp = self.model.layers[layer].mlp
            batch, seq = values["router_logits"].shape[:2]
            # the router's classes by its layout: num_experts, or more where it also scores experts that compute nothing
            classes = axis_size(mlp, type(mlp).router_logits.dims[-1])
            assert values["router_logits"].shape == (batch, seq, classes)
            assert values["expert_weights"].shape == values["expert_indices"].shape == (batch, seq, mlp.top_k)
            assert not values["expert_indices"].is_floating_point(), "expert_indices are integers"
            if "expert_outputs" in values:
                assert values["expert_outputs"].shape == (batch, seq, mlp.top_k, self.model.hidden_size)

    def test_slots_add_up_to_the_routed_and_the_mixture_output(self) -> None:
        """The slots sum to ``routed_output``, and ``mixture_output(routed, shared)`` is what the mixture gives.

        That is ``mlp_output``, unless the block lays its contribution out
        otherwise than the branches (a streams block weights the module's
        output into each stream): then it is the module's own output, and the
        layer suite checks the contribution.
        """
        # The shared expert in a trace of its own: a mixture may run it before or after the routed experts.
        shared_reads = self.read_moe(PROMPT, "shared_expert_output")
        found = []
        with self.model.trace(PROMPT):
            for layer in self.moe_layers():
                mlp = self.model.layers[layer].mlp
                slots = mlp.expert_outputs.save() if mlp.support()["expert_outputs"] is None else None
                routed = mlp.routed_output.save()
                branches_laid_out = type(mlp).mlp_output.dims == type(mlp).routed_output.dims
                found.append((slots, routed, (mlp.mlp_output if branches_laid_out else mlp.output).save()))
        for layer, (slots, routed, mixture), shared in zip(self.moe_layers(), found, shared_reads, strict=True):
            if slots is not None:
                close(slots.sum(2), routed, what=f"layers[{layer}] slots' sum")
            with torch.no_grad():
                mixed = self.model.layers[layer].mlp.mixture_output(routed, shared.get("shared_expert_output"))
            close(mixed, mixture, what=f"layers[{layer}] routed and shared combined")

    def test_scoring_reproduces_indices_and_weights_from_the_logits(self) -> None:
        for layer, values in zip(self.moe_layers(), self.read_moe(PROMPT, *ROUTING), strict=True):
            indices, weights = self.model.layers[layer].mlp.route(values["router_logits"])
            served_indices, served_weights = by_expert(values["expert_indices"], values["expert_weights"])
            assert torch.equal(served_indices, indices), f"layers[{layer}]: served indices are not the scoring's top-k"
            close(served_weights, weights, what=f"layers[{layer}] weights from the logits")

    # -- writes ------------------------------------------------------------------

    def test_zero_weights_silence_the_routed_experts(self) -> None:
        layer = self.moe_layers()[0]
        with self.model.trace(PROMPT):
            clean = self.model.logits.save()
        with self.model.trace(PROMPT):
            mlp = self.model.layers[layer].mlp
            mlp.expert_weights = torch.zeros_like(mlp.expert_weights)
            routed = mlp.routed_output.save()
            ablated = self.model.logits.save()
        assert torch.count_nonzero(routed) == 0, "zero weights left a routed output"
        assert not torch.allclose(clean, ablated), "silencing the experts left the logits as they were"

    def test_a_logits_write_routes_every_token_to_the_favoured_experts(self) -> None:
        layer = self.moe_layers()[0]
        mlp = self.model.layers[layer].mlp
        favoured = torch.arange(mlp.num_experts - mlp.top_k, mlp.num_experts)
        with self.model.trace(PROMPT):
            logits = mlp.router_logits
            written = torch.full_like(logits, -30.0)
            written[..., favoured] = 30.0
            mlp.router_logits = written
            indices = mlp.expert_indices.save()
        chosen = indices.sort(-1).values
        assert torch.equal(chosen, favoured.expand_as(chosen)), f"tokens went to {chosen.unique().tolist()}"

    def test_an_index_write_reroutes_while_the_weight_stays(self) -> None:
        if not self.moe_serves("expert_outputs"):
            raise unittest.SkipTest("the per-slot outputs show the rerouting; this model does not serve them")
        layer = self.moe_layers()[0]
        if self.model.layers[layer].mlp.top_k < 2:
            raise unittest.SkipTest("one routing slot per token: no second slot whose expert slot 0 could take")
        with self.model.trace(PROMPT):
            mlp = self.model.layers[layer].mlp
            weights = mlp.expert_weights.save()
            indices = mlp.expert_indices
            original = indices.clone().save()
            # Slot 0 computes the expert slot 1 chose: same expert, same input, each slot's own weight.
            indices[..., 0] = indices[..., 1]
            outputs = mlp.expert_outputs.save()
        assert not torch.equal(original[..., 0], original[..., 1])
        close(outputs[..., 0, :] * weights[..., 1:2], outputs[..., 1, :] * weights[..., 0:1], what="rerouted slot 0")
        with self.model.trace(PROMPT):
            clean = self.model.layers[layer].mlp.expert_outputs.save()
        close(outputs[..., 1, :], clean[..., 1, :], what="the slot left alone")
        assert not torch.allclose(outputs[..., 0, :], clean[..., 0, :]), "the index write did not reroute slot 0"

    def test_a_wrong_write_is_refused_before_the_model_changes(self) -> None:
        layer = self.moe_layers()[0]
        with self.model.trace(PROMPT):
            clean = self.model.logits.save()
        for name, bad in (("expert_weights", lambda v: v[..., :-1]), ("expert_indices", lambda v: v.float())):
            with raises(ValueError, name), self.model.trace(PROMPT):
                mlp = self.model.layers[layer].mlp
                setattr(mlp, name, bad(getattr(mlp, name)))
            with self.model.trace(PROMPT):
                after = self.model.logits.save()
            close(after, clean, what=f"logits after a refused {name} write")

    def test_a_routing_value_asked_for_after_its_place_raises_at_once(self) -> None:
        layer = self.moe_layers()[0]
        with raises(OrderError, "router_logits"), self.model.trace(PROMPT):
            mlp = self.model.layers[layer].mlp
            mlp.routed_output.save()
            mlp.router_logits.save()

    def test_eager_experts_say_why_they_hold_no_slots(self) -> None:
        model = tiny_standardized(self.family, experts_implementation="eager", **self.load)
        mlp = model.layers[self.moe_layers()[0]].mlp
        reason = mlp.support()["expert_outputs"]
        assert reason is not None and ("grouped_mm" in reason or "routed_output" in reason), reason
        with raises(Unavailable, "expert_outputs"), model.trace(PROMPT):
            mlp.expert_outputs.save()
        assert mlp.support()["routed_output"] is None, "the experts' sum is served on every implementation"

    # -- batches and generation ----------------------------------------------------

    def test_a_left_padded_batch_equals_the_single_runs(self) -> None:
        names = (*ROUTING, "expert_outputs", "routed_output")
        tokenizer = self.model.tokenizer
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        try:
            batched = self.read_moe(list(BATCH), *names)
        finally:
            tokenizer.padding_side = side
        for row, prompt in enumerate(BATCH):
            real = len(tokenizer(prompt).input_ids)
            rows = [{name: value[row : row + 1, -real:] for name, value in values.items()} for values in batched]
            for layer, together, alone in zip(self.moe_layers(), rows, self.read_moe(prompt, *names), strict=True):
                self.same_routing(together, alone, f"layers[{layer}] {prompt!r} in a padded batch")

    def same_routing(self, served: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str) -> None:
        """Assert two reads of one block's values agree, slot by slot once both are put in expert order."""
        for name in ("router_logits", "routed_output"):
            if name in expected:
                close(served[name], expected[name], atol=ATOL * 10, what=f"{what}: {name}")
        slotted = [name for name in ("expert_weights", "expert_outputs") if name in expected]
        ours = by_expert(served["expert_indices"], *(served[name] for name in slotted))
        theirs = by_expert(expected["expert_indices"], *(expected[name] for name in slotted))
        for name, a, b in zip(("expert_indices", *slotted), ours, theirs, strict=True):
            close(a, b, atol=ATOL * 10, what=f"{what}: {name}")

    def test_two_invokes_each_read_and_write_their_own_rows(self) -> None:
        layer = self.moe_layers()[0]
        names = (*ROUTING, "routed_output")
        alone = [self.read_moe(prompt, *names)[0] for prompt in BATCH]
        served: list[dict[str, torch.Tensor]] = []
        with self.model.trace() as tracer:
            for index, prompt in enumerate(BATCH):
                with tracer.invoke(prompt):
                    mlp = self.model.layers[layer].mlp
                    values = {name: getattr(mlp, name).save() for name in ROUTING}
                    if index == 0:
                        mlp.expert_weights = torch.zeros_like(mlp.expert_weights)
                    values["routed_output"] = mlp.routed_output.save()
                    served.append(values)
        assert served[0]["router_logits"].shape[0] == 1, "each invoke reads its own row"
        padded = served[0]["router_logits"].shape[1]
        for values, expected, prompt in zip(served, alone, BATCH, strict=True):
            real = expected["router_logits"].shape[1]
            # nnsight pads the shorter prompt on the tokenizer's side.
            span = slice(padded - real, padded) if self.model.tokenizer.padding_side == "left" else slice(0, real)
            values = {name: value[:, span] for name, value in values.items()}
            if prompt == BATCH[0]:
                assert torch.count_nonzero(values.pop("routed_output")) == 0, "the first invoke's write missed its rows"
                expected = {name: value for name, value in expected.items() if name != "routed_output"}
            self.same_routing(values, expected, f"invoke of {prompt!r}")

    def test_every_decode_step_serves_its_routing(self) -> None:
        layer = self.moe_layers()[0]
        steps: list[tuple[torch.Tensor, ...]] = []
        with self.model.generate(PROMPT, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False) as tracer:
            for _ in tracer.iter[:STEPS]:
                mlp = self.model.layers[layer].mlp
                steps.append(tuple(getattr(mlp, name).save() for name in ROUTING))
        assert len(steps) == STEPS
        prompt_length = steps[0][0].shape[1]
        assert prompt_length > 1 and all(step[0].shape[1] == 1 for step in steps[1:]), "decode steps are one token"
        for step, (logits, weights, indices) in enumerate(steps):
            expected_indices, expected_weights = self.model.layers[layer].mlp.route(logits)
            served_indices, served_weights = by_expert(indices, weights)
            assert torch.equal(served_indices, expected_indices), f"step {step}: indices are not the logits' top-k"
            close(served_weights, expected_weights, what=f"step {step} weights")
