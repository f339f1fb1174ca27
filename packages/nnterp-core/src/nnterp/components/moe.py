"""Moe: a mixture-of-experts feed-forward, its routing and each routed expert's output.

transformers builds nearly every mixture of experts from the same parts: a
router whose forward computes logits with one linear map and turns them into
each token's top-k experts and weights, and an experts module called with the
tokens, those indices and those weights, whose forward
(``use_experts_implementation``) dispatches to ``grouped_mm`` or
``batched_mm``, where each slot's weighted output is one tensor before the
slots are summed. ``Moe`` reads its values at those places; a family states
the facts that differ (how its router scores, where a shared expert's
contribution is made) as class constants.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..descriptor import TokenEProperty, unavailable
from ..forward_source import ForwardSource
from ..layouts import ExpertIndices, ExpertOutputs, ExpertWeights, Residual, RouterLogits
from ..value_paths import BoundArgument, resolve
from .mlp import Mlp
from .standard import contribution

#: The experts implementations whose forward holds each slot's weighted output as one tensor.
GROUPED = ("grouped_mm", "batched_mm")
#: In the forward transformers gives a decorated experts class: the call of the implementation it dispatches to.
EXPERTS_CALL = "experts_forward_1"
#: Inside grouped_mm and batched_mm: the weighted outputs viewed as [tokens, top_k, hidden], the slots' sum's input.
SLOT_OUTPUTS = "weighted_out_view_0"

PER_EXPERT = (
    "each expert has its own activation and output projection, so a mixture of experts has no single one; read "
    "expert_outputs, or the experts' weights under experts"
)
MOE_ORDER = (
    "a mixture of experts produces router_logits, then the experts' arguments (expert_weights, expert_indices), "
    "then expert_outputs and routed_output, then shared_expert_output and mlp_output; read and write them in that "
    "order, or in separate traces"
)


@dataclass(frozen=True)
class Scoring:
    """What a router's logits mean: how it turns them into each token's expert indices and weights.

    ``function`` (``"softmax"``, ``"sigmoid"`` or ``"sqrtsoftplus"``) scores the logits. A router
    picks the ``top_k`` highest scores, or, with ``bias``, the highest of the
    scores plus that router attribute (a selection bias that chooses experts
    but does not weigh them), within its best ``n_group`` / ``topk_group``
    groups where it has them. With ``after_top_k`` it picks the top-k
    logits first and scores only those (a softmax over the k chosen). The
    weights are the chosen scores, renormalized to sum to one where
    ``normalize`` is true or names a true router attribute
    (``norm_topk_prob``), then multiplied by the router attribute ``scale``
    (one number) and by the router attribute ``expert_scale`` at each chosen
    expert (one number per expert).

    :meth:`route` is the reference: the MoE suite checks that it reproduces
    the served ``expert_indices`` and ``expert_weights`` from the served
    ``router_logits``.
    """

    function: str = "softmax"
    after_top_k: bool = False
    normalize: bool | str = False
    bias: str | None = None
    scale: str | None = None
    expert_scale: str | None = None

    def score(self, logits: torch.Tensor) -> torch.Tensor:
        """The scores of ``logits``, in float32."""
        logits = logits.float()
        if self.function == "sqrtsoftplus":
            return torch.nn.functional.softplus(logits).sqrt()
        return logits.sigmoid() if self.function == "sigmoid" else logits.softmax(-1)

    def route(self, router: torch.nn.Module, logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The indices and weights ``router`` gives ``logits`` [..., num_experts], each [..., top_k], slots in expert order."""
        if self.after_top_k:
            chosen, indices = logits.float().topk(top_k, dim=-1)
            weights = self.score(chosen)
        else:
            scores = self.score(logits)
            choice = scores if self.bias is None else scores + getattr(router, self.bias).float()
            indices = self._within_groups(router, choice).topk(top_k, dim=-1).indices
            weights = scores.gather(-1, indices)
        normalize = getattr(router, self.normalize) if isinstance(self.normalize, str) else self.normalize
        if normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        if self.scale is not None:
            weights = weights * getattr(router, self.scale)
        if self.expert_scale is not None:
            weights = weights * getattr(router, self.expert_scale).float()[indices]
        order = indices.argsort(-1)
        return indices.gather(-1, order), weights.gather(-1, order)

    @staticmethod
    def _within_groups(router: torch.nn.Module, choice: torch.Tensor) -> torch.Tensor:
        """``choice`` with the experts outside the router's best ``topk_group`` groups (ranked by their top two) masked."""
        groups = getattr(router, "n_group", None) or getattr(router, "num_group", None) or 1
        kept = getattr(router, "topk_group", groups)
        if groups == 1 or kept >= groups:
            return choice
        grouped = choice.unflatten(-1, (groups, -1))
        best = grouped.topk(2, dim=-1).values.sum(-1).topk(kept, dim=-1).indices
        mask = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter(-1, best, True)
        return grouped.masked_fill(~mask.unsqueeze(-1), float("-inf")).flatten(-2)


SOFTMAX = Scoring()


def mixture_reason(moe: Moe) -> str | None:
    """Why this module runs no mixture of experts, or ``None``: the one place a family decides it (``Moe.no_mixture``)."""
    return moe.no_mixture()


def needs_grouped_experts(moe: Moe) -> str | None:
    """Why the per-slot expert outputs are unavailable, or ``None``: they exist only in the grouped_mm / batched_mm forwards."""
    reason = moe.no_mixture()
    if reason is not None:
        return reason
    experts = moe.experts_module()
    name = type(experts).__name__
    if "experts_interface" not in ForwardSource.of(type(experts).forward).nonlocal_names():
        return (
            f"{name} has one forward of its own, which runs the experts one after another and sums each slot's "
            f"output into the result as it goes, so no tensor holds the slots; read routed_output"
        )
    implementation = getattr(getattr(experts, "config", None), "_experts_implementation", None)
    if implementation not in GROUPED:
        return (
            f"the model runs its experts with experts_implementation={implementation!r}, which holds no tensor of "
            f"each slot's output; load it with experts_implementation='grouped_mm' (or 'batched_mm')"
        )
    return None


def no_shared_expert(moe: Moe) -> str | None:
    """Why shared_expert_output is unavailable on this mixture, or ``None``: it has no shared expert."""
    reason = moe.no_mixture()
    if reason is not None:
        return reason
    if moe.SHARED is None:
        return f"{type(moe._module).__name__} has no shared expert: every expert it runs is routed"
    return None


def _argument(role: str):
    def select(moe: Moe) -> BoundArgument:
        # The class's forward, less ``self``: transformers' wrapper keeps the wrapped forward's signature, which
        # inspect reports whole even on the bound method.
        signature = inspect.signature(type(moe.experts_module()).forward)
        unbound = signature.replace(parameters=list(signature.parameters.values())[1:])
        return BoundArgument(unbound, getattr(moe, role))

    return select


class Moe(Mlp):
    """A mixture of experts: its routing, each routed expert's output, and the shared expert's.

    ``mlp_output`` is what the block adds, as on any ``Mlp``. The rest is read
    where the model computes or consumes it, under the standard child names
    ``router`` and ``experts`` (a family aliases its own spelling, ``gate``, in
    its ``RENAME``):

    - ``router_logits`` [batch, seq, num_experts], where the router's forward
      computes them, before it scores them (``SCORING``);
    - ``expert_weights`` and ``expert_indices`` [batch, seq, top_k], the
      experts module's arguments;
    - ``expert_outputs`` [batch, seq, top_k, hidden_size], each slot's
      weighted output inside transformers' ``grouped_mm`` / ``batched_mm``
      experts forward, and ``routed_output``, their sum;
    - ``shared_expert_output``, the shared expert's contribution where the
      mixture has one (``SHARED``), so that
      ``routed_output + shared_expert_output == mlp_output``.

    The model holds them flat over tokens; each is served as this invoke's
    [batch, seq, ...] (:class:`~nnterp.TokenEProperty`). ``num_experts`` and
    ``top_k`` are read off the router or the experts module. A family whose
    module runs the mixture only on some checkpoints says why not in
    ``no_mixture``, which every value's availability starts from.
    """

    #: How the router scores its logits into weights and indices.
    SCORING: ClassVar[Scoring] = SOFTMAX
    #: The router, from this module.
    ROUTER: ClassVar[str] = "router"
    #: Where the router's forward computes its logits, from the router.
    LOGITS: ClassVar[str] = "source.F_linear_0.output"
    #: The experts module, from this module.
    EXPERTS: ClassVar[str] = "experts"
    #: The experts forward's parameters taking each token's expert indices and their weights.
    INDICES: ClassVar[str] = "top_k_index"
    WEIGHTS: ClassVar[str] = "top_k_weights"
    #: Where the shared expert's contribution (after any gate) is made, from this module; ``None`` without one.
    SHARED: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A shared expert's gate is applied in this module's forward after the experts return, so it is read after
        # their values, once the worker is inside the call: the forward must be instrumented before the call.
        cls.sourced = cls.sourced or "source." in (cls.SHARED or "")

    @TokenEProperty(contribution)
    def mlp_output(self, value: Any) -> Residual:
        """What the mixture adds to the residual stream, [batch, seq, hidden_size].

        The module's output, or where the block changes it on the way in
        (``CONTRIBUTION``); served per invoke where the module returns it flat
        over tokens (Llama-4's). Assign or edit in place.
        """
        return value

    mlp_activation = unavailable(PER_EXPERT)
    mlp_neurons = unavailable(PER_EXPERT)

    def no_mixture(self) -> str | None:
        """Why this module runs no mixture of experts, or ``None`` (every Moe module does, unless its family says otherwise)."""
        return None

    def order_hint(self, name: str) -> str:
        """The order this module's forward produces its values in, for an out-of-order error."""
        return MOE_ORDER

    def router_module(self) -> torch.nn.Module:
        """The router, which computes the logits and picks each token's experts."""
        return resolve(self, f"{self.ROUTER}.output")[0]._module

    def experts_module(self) -> torch.nn.Module:
        """The experts module, called with the tokens, their expert indices and weights."""
        return resolve(self, f"{self.EXPERTS}.output")[0]._module

    def _size(self, *names: str) -> int:
        modules = (self.router_module(), self.experts_module(), self._module)
        for module in modules:
            for name in names:
                value = getattr(module, name, None)
                if isinstance(value, int):
                    return value
        raise AttributeError(f"neither {type(self._module).__name__} nor its router or experts has {' / '.join(names)}")

    @property
    def num_experts(self) -> int:
        """Routed experts in this mixture: the router's or experts module's ``num_experts`` (or its spelling)."""
        return self._size("num_experts", "num_local_experts", "n_routed_experts")

    @property
    def top_k(self) -> int:
        """Experts each token is routed to: the router's or module's ``top_k`` / ``num_experts_per_tok``."""
        return self._size("top_k", "num_experts_per_tok")

    @property
    def intermediate_size(self) -> int:
        """Width of one routed expert's hidden layer, read off the experts module."""
        return self._size("intermediate_dim", "expert_dim", "intermediate_size", "ffn_hidden_size")

    def mixture_output(self, routed: torch.Tensor, shared: torch.Tensor | None) -> torch.Tensor:
        """What the block adds (``mlp_output``) from ``routed_output`` and ``shared_expert_output`` (``None`` without one).

        Their sum; a family whose block combines the branches otherwise
        (normalizing each, as Gemma-4's does) says how. The MoE suite checks
        that it gives the served ``mlp_output``.
        """
        return routed if shared is None else routed + shared

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The indices and weights this mixture's router gives ``logits`` (``SCORING.route``): the reference routing."""
        return self.SCORING.route(self.router_module(), logits, self.top_k)

    @TokenEProperty(lambda moe: f"{moe.ROUTER}.{moe.LOGITS}", unavailable=mixture_reason)
    def router_logits(self, value: Any) -> RouterLogits:
        """The router's logits, [batch, seq, num_experts], where its forward computes them.

        Before the router scores them (``SCORING``) and before any selection
        bias, so ``softmax(router_logits)`` is the routing distribution of a
        softmax router. Assign or edit in place: the router scores what is
        written, and the indices and weights follow.
        """
        return value

    @TokenEProperty(lambda moe: f"{moe.EXPERTS}.inputs", select=_argument("WEIGHTS"), unavailable=mixture_reason)
    def expert_weights(self, value: Any) -> ExpertWeights:
        """The weights the experts receive, [batch, seq, top_k], one per routing slot.

        After the router's normalization and scaling: what multiplies each
        slot's expert output. Zero ``[b, t, j]`` to remove slot ``j`` of
        token ``t``; ``w.masked_fill(expert_indices == e, 0)`` removes expert
        ``e``. Assign or edit in place.
        """
        return value

    @TokenEProperty(lambda moe: f"{moe.EXPERTS}.inputs", select=_argument("INDICES"), unavailable=mixture_reason)
    def expert_indices(self, value: Any) -> ExpertIndices:
        """The experts each token is routed to, [batch, seq, top_k], integers.

        Write an index to send that slot to another expert; its weight stays
        what the router gave the expert it chose. Assign or edit in place.
        """
        return value

    @TokenEProperty(
        lambda moe: f"{moe.EXPERTS}.source.{EXPERTS_CALL}.source.{SLOT_OUTPUTS}.output",
        unavailable=needs_grouped_experts,
    )
    def expert_outputs(self, value: Any) -> ExpertOutputs:
        """Each slot's expert output times its weight, [batch, seq, top_k, hidden_size], before the slots are summed.

        ``expert_outputs.sum(2) == routed_output``. The model's own tensor in
        transformers' ``grouped_mm`` (the default) and ``batched_mm`` experts
        forwards, unavailable under ``experts_implementation="eager"`` and hub
        kernels. Assign or edit in place: the sum is taken of what is written.
        """
        return value

    @TokenEProperty(lambda moe: f"{moe.EXPERTS}.output", unavailable=mixture_reason)
    def routed_output(self, value: Any) -> Residual:
        """The routed experts' output, [batch, seq, hidden_size]: ``expert_outputs.sum(2)``. Assign or edit in place."""
        return value

    @TokenEProperty(lambda moe: moe.SHARED, unavailable=no_shared_expert)
    def shared_expert_output(self, value: Any) -> Residual:
        """The shared expert's contribution, [batch, seq, hidden_size], after its gate where it has one.

        ``routed_output + shared_expert_output == mlp_output``. Assign or edit
        in place.
        """
        return value
