"""LongCat-Flash: a block of two pre-norm attention + MLP pairs, and a mixture of experts taken as a shortcut.

Each decoder block (``config.num_layers`` of them; the config's
``num_hidden_layers`` counts the attention layers, twice as many) holds two
multi-head latent attentions (``self_attn``, a ``ModuleList`` of two), two
dense MLPs (``mlps``), their pre-norms (``input_layernorm`` and
``post_attention_layernorm``, a ``ModuleList`` of two each) and one mixture of
experts (``mlp``). The mixture reads the first MLP's normed input, and its
output is added only at the very end::

    layer_mid      = layer_input + attention_output                   # the first pair's stream between its sublayers
    second_input   = layer_mid + dense_mlp.mlp_output                 # what the second pair reads
    second_mid     = second_input + second_attn.attention_output
    layer_output   = second_mid + second_dense_mlp.mlp_output + mlp.mlp_output

so ``layer_output == layer_input + attn0 + mlp0 + attn1 + mlp1 + moe``.

The standard names:

- ``self_attn``: the first attention (``self_attn[0]``). transformers spells
  the pair ``self_attn``, a name an nnsight alias cannot take over (an alias
  never shadows a child), so the block's envoy points ``self_attn`` at the
  pair's first entry itself (``LongcatFlashLayer``); the pair stays in the
  module tree under its native name and paths, its second entry is
  ``second_attn``.
- ``mlp``: the mixture of experts, under transformers' own name, so the
  mixture of experts suite and every tool that looks for a ``Moe`` at ``mlp``
  find it. Its ``mlp_output`` is what the block adds at the end.
- ``dense_mlp`` and ``second_dense_mlp``: the two dense MLPs
  (``mlps[0]``, ``mlps[1]``).
- the block's boundaries: ``layer_input``, ``attention_norm_output``,
  ``layer_mid``, ``mlp_norm_output`` (what the mixture and the first dense MLP
  both read; ``mlp_input`` is the mixture's input), then the second pair's
  ``second_input``, ``second_attention_norm_output``, ``second_mid`` and
  ``second_mlp_norm_output``, and ``layer_output``. The norms themselves stay
  transformers' ``ModuleList``\\ s.

The contributions are listed (``CONTRIBUTIONS``) in the order the forward
makes them, the mixture's second: it runs before the first dense MLP, though
its output is added last; a trace reads them in that order.

The router scores ``n_routed_experts + zero_expert_num`` classes with a
softmax and picks the top ``moe_topk`` of the scores plus
``e_score_correction_bias`` (a selection bias), weighing them by the plain
scores times ``routed_scaling_factor``, unrenormalized. The classes past the
routed experts are zero-computation experts: an expert ``e >= num_experts``
gives the token itself, times its weight. ``expert_indices`` and
``expert_weights`` are the router's choice over all the classes, read where
the router returns them (from transformers 5.25 the mixture rewrites an
identity slot before the experts module sees it, so the experts' arguments no
longer say which slots chose an identity expert). ``routed_output`` is every
slot's weighted output summed, the identity experts' included: the mixture's
output, which is ``mlp_output`` (there is no shared expert).

Where each identity slot's output lives differs by release: up to 5.24 the
experts module adds it into its result, token by token, with the computing
experts', so no tensor holds it apart; from 5.25 the mixture computes all the
identity slots' sum (``identity_output``) and adds it to the experts module's
output, whose grouped_mm slots then hold zero for an identity slot. Either
way no tensor holds every slot's output, so ``expert_outputs`` is unavailable
on a model with identity experts.
"""

from __future__ import annotations

import ast
from typing import Any

from jaxtyping import Float
from torch import Tensor
from transformers.models.longcat_flash import modeling_longcat_flash as MODELING

from nnterp import EProperty, Layer, Mlp, Moe, Scoring, TokenEProperty, mixture_reason, needs_grouped_experts
from nnterp.components.moe import EXPERTS_CALL, SLOT_OUTPUTS
from nnterp.forward_source import Binding, ForwardSource, Place
from nnterp.layouts import BATCH, SEQ, ExpertIndices, ExpertOutputs, ExpertWeights, Residual
from nnterp_attention.attention import Attention

#: The classes the router scores: the routed experts, then the identity experts.
ROUTER_CLASSES = "router_classes"
RouterClasses = Float[Tensor, f"{BATCH} {SEQ} {ROUTER_CLASSES}"]


def _router_returns() -> int:
    """How many values the installed router returns: its weights and indices last, after its logits from 5.20 on.

    Read from the return statement of the installed router's forward.
    """
    (returned,) = [
        node.value
        for node in ast.walk(ForwardSource.of(MODELING.LongcatFlashTopkRouter.forward).definition)
        if isinstance(node, ast.Return)
    ]
    return len(returned.elts)


#: Where the router's output tuple holds the expert weights and indices.
INDICES_AT = _router_returns() - 1
WEIGHTS_AT = INDICES_AT - 1
#: The mixture's sum of the identity slots' outputs, in the forwards that compute it apart (transformers 5.25 on).
IDENTITY_OUTPUT = Place(Binding("identity_output"))

MOE_ORDER = (
    "LongCat-Flash's mixture produces router_logits, then expert_weights and expert_indices (the router's output), "
    "then identity_output, then expert_outputs, then routed_output and mlp_output (the mixture's output, one "
    "place); it runs after layer_mid and mlp_norm_output and before the first dense MLP; read and write them in "
    "that order, or in separate traces"
)
WITH_IDENTITY_EXPERTS = (
    "this mixture has identity experts (config.zero_expert_num={count}), whose slots' outputs no tensor holds "
    "beside the computing experts' (the experts module's slots hold zero for them), so no tensor holds every "
    "slot's output; read routed_output, and identity_output for the identity slots' sum"
)
IDENTITY_INSIDE_EXPERTS = (
    "this transformers' experts module adds each identity slot's output into its result token by token, with the "
    "computing experts', so no tensor holds the identity slots' sum; read routed_output"
)


class LongcatFlashLayer(Layer):
    """A block of two attention + MLP pairs: ``self_attn`` is the first attention, its boundaries the first pair's.

    ``self_attn`` names the first entry of the block's ``ModuleList`` of two
    attentions, whose name transformers gives the pair (``over_children``);
    the second is ``second_attn``.
    """

    over_children = {"self_attn": "self_attn.0"}

    @EProperty("input_layernorm.0.output")
    def attention_norm_output(self, value: Any) -> Residual:
        """What the first attention is called with: its pre-norm's output, [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value

    @EProperty("post_attention_layernorm.0.input", shared=True)
    def layer_mid(self, value: Any) -> Residual:
        """The residual stream between the first attention and the first dense MLP, [batch, seq, hidden_size].

        ``layer_input + attention_output``. Assign or edit in place: either
        reaches the first MLP's norm and the residual the dense MLP's output
        is added to (the mixture reads the norm's output too).
        """
        return value

    @EProperty("post_attention_layernorm.0.output")
    def mlp_norm_output(self, value: Any) -> Residual:
        """The first MLP's pre-norm output, [batch, seq, hidden_size]: what the mixture and the first dense MLP read.

        Assign or edit in place: both receive what is written.
        """
        return value

    @EProperty("mlp.input")
    def mlp_input(self, value: Any) -> Residual:
        """What the mixture of experts is called with, [batch, seq, hidden_size]: ``mlp_norm_output``.

        Assign or edit in place: the mixture alone receives it (the first
        dense MLP reads ``mlp_norm_output``).
        """
        return value

    @EProperty("input_layernorm.1.input", shared=True)
    def second_input(self, value: Any) -> Residual:
        """The residual stream entering the second pair, [batch, seq, hidden_size].

        ``layer_mid + dense_mlp.mlp_output`` (the mixture's output is added
        only at the end). Assign or edit in place: either reaches the second
        attention's norm and the residual its output is added to.
        """
        return value

    @EProperty("input_layernorm.1.output")
    def second_attention_norm_output(self, value: Any) -> Residual:
        """What the second attention is called with: its pre-norm's output, [batch, seq, hidden_size].

        Assign or edit in place.
        """
        return value

    @EProperty("post_attention_layernorm.1.input", shared=True)
    def second_mid(self, value: Any) -> Residual:
        """The residual stream between the second attention and the second dense MLP, [batch, seq, hidden_size].

        ``second_input + second_attn.attention_output``. Assign or edit in
        place: either reaches the second MLP's norm and the residual its
        output and the mixture's are added to.
        """
        return value

    @EProperty("post_attention_layernorm.1.output")
    def second_mlp_norm_output(self, value: Any) -> Residual:
        """The second dense MLP's pre-norm output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value


def _no_slots(moe: LongcatFlashMoe) -> str | None:
    """Why ``expert_outputs`` is unavailable: the experts' own forward, or identity experts beside grouped slots."""
    reason = needs_grouped_experts(moe)
    if reason is not None:
        return reason
    count = moe.zero_expert_num
    return WITH_IDENTITY_EXPERTS.format(count=count) if count else None


def _no_identity_output(moe: LongcatFlashMoe) -> str | None:
    reason = mixture_reason(moe)
    if reason is not None:
        return reason
    if not moe.zero_expert_num:
        return f"this mixture has no identity experts (config.zero_expert_num={moe.zero_expert_num!r})"
    return IDENTITY_INSIDE_EXPERTS if IDENTITY_OUTPUT.reason(moe) is not None else None


class LongcatFlashMoe(Moe):
    """The shortcut mixture: a softmax over the routed and the identity experts, chosen with a selection bias, scaled.

    ``expert_indices`` and ``expert_weights`` are the router's choice over
    every class (an index ``>= num_experts`` is an identity expert);
    ``routed_output`` is the mixture's output, every slot's weighted output
    summed, the identity slots' (the token times its weight) included.
    """

    SCORING = Scoring(bias="e_score_correction_bias", scale="routed_scaling_factor")
    # identity_output is an operation in this module's forward, read after the router (a child) has run
    sourced = True

    @property
    def zero_expert_num(self) -> int:
        """The identity experts, which compute nothing: ``config.zero_expert_num``."""
        return self.router_module().n_routed_experts - self.num_experts

    @property
    def router_classes(self) -> int:
        """What the router scores: the routed experts, then the identity experts."""
        return self.router_module().n_routed_experts

    def order_hint(self, name: str) -> str:
        """The order the mixture's forward produces its values in, for an out-of-order error."""
        return MOE_ORDER

    @TokenEProperty(lambda moe: f"{moe.ROUTER}.{moe.LOGITS}", unavailable=mixture_reason)
    def router_logits(self, value: Any) -> RouterClasses:
        """The router's logits, [batch, seq, router_classes]: the routed experts', then the identity experts'.

        Before the softmax and the selection bias. Assign or edit in place:
        the router scores what is written.
        """
        return value

    @TokenEProperty(lambda moe: f"{moe.ROUTER}.output", select=WEIGHTS_AT, unavailable=mixture_reason)
    def expert_weights(self, value: Any) -> ExpertWeights:
        """The weights the router gives each slot, [batch, seq, top_k]: the chosen scores times routed_scaling_factor.

        An identity slot's weight multiplies the token itself. Assign or
        edit in place: the experts and the identity experts weigh by what is
        written.
        """
        return value

    @TokenEProperty(lambda moe: f"{moe.ROUTER}.output", select=INDICES_AT, unavailable=mixture_reason)
    def expert_indices(self, value: Any) -> ExpertIndices:
        """The classes each token is routed to, [batch, seq, top_k]: an index ``>= num_experts`` is an identity expert.

        The router's choice, before the mixture sends an identity slot
        elsewhere. Write an index to send that slot to another expert (an
        identity one included); its weight stays. Assign or edit in place.
        """
        return value

    @TokenEProperty(IDENTITY_OUTPUT, unavailable=_no_identity_output)
    def identity_output(self, value: Any) -> Residual:
        """What the identity experts add, [batch, seq, hidden_size]: ``mlp_input`` times the identity slots' summed weight.

        Computed apart from the experts from transformers 5.25 on. Assign or
        edit in place: the mixture adds what is written to the computing
        experts' output.
        """
        return value

    @TokenEProperty(
        lambda moe: f"{moe.EXPERTS}.source.{EXPERTS_CALL}.source.{SLOT_OUTPUTS}.output", unavailable=_no_slots
    )
    def expert_outputs(self, value: Any) -> ExpertOutputs:
        """Each slot's expert output times its weight: unavailable on a mixture with identity experts (see ``support``)."""
        return value

    @TokenEProperty("output", unavailable=mixture_reason)
    def routed_output(self, value: Any) -> Residual:
        """Every slot's weighted output summed, the identity experts' included, [batch, seq, hidden_size].

        The mixture's output, the same tensor as ``mlp_output``. Assign or
        edit in place.
        """
        return value


MODEL_TYPES = ("longcat_flash",)
#: In the order the forward makes them: the mixture runs before the first dense MLP, though it is added last.
CONTRIBUTIONS = (
    ("self_attn", "attention_output"),
    ("mlp", "mlp_output"),
    ("dense_mlp", "mlp_output"),
    ("second_attn", "attention_output"),
    ("second_dense_mlp", "mlp_output"),
)
ENVOYS = {
    MODELING.LongcatFlashDecoderLayer: LongcatFlashLayer,
    MODELING.LongcatFlashMLA: Attention,
    MODELING.LongcatFlashMLP: Mlp,
    MODELING.LongcatFlashMoE: LongcatFlashMoe,
}
RENAME = {"self_attn.1": "second_attn", "mlps.0": "dense_mlp", "mlps.1": "second_dense_mlp"}
# Two blocks (four attention layers); four routed experts and two identity experts, two chosen per token.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    ffn_hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    head_dim=8,  # the rotary width: qk_rope_head_dim
    v_head_dim=12,
    n_routed_experts=4,
    zero_expert_num=2,
    moe_topk=2,
    expert_ffn_hidden_size=16,
    max_position_embeddings=64,
)
