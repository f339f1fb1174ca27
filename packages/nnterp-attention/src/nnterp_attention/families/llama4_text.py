"""Llama-4's text model: a pre-norm block whose MLP is a dense one or a mixture of experts with a shared expert.

The block's MLP is ``feed_forward`` (-> ``mlp``): a ``Llama4TextMLP`` where
``moe_layers`` does not name the block, else a ``Llama4TextMoe``, whose
routing is not the standard one:

- the router (``Llama4Router``, an ``nn.Linear``) takes its logits with
  ``super().forward``, picks the top-k logits (``torch.topk``), scatters them
  into a row of ``-inf`` and takes the sigmoid, so each token's scores are the
  sigmoid of its top-k logits at the chosen experts and zero elsewhere;
- the mixture scales each expert's *input* by its score, runs every expert on
  every token (zero inputs where not routed, which give zero outputs) and sums
  the experts;
- it adds that sum in place to the shared expert's output
  (``out.add_(...)``), which is what the block adds.

So ``expert_weights`` and ``expert_indices`` are read at the router's top-k,
``routed_output`` at the experts' sum, and the shared expert's output where it
returns; there is no per-slot output (``expert_outputs``).
"""

from typing import Any

import torch
from transformers.models.llama4 import modeling_llama4 as MODELING

from nnterp import Layer, Mlp, Moe, Scoring, TokenEProperty, unavailable
from nnterp.components.moe import mixture_reason, no_shared_expert
from nnterp.descriptor import invoke_rows
from nnterp.layouts import ExpertIndices, ExpertWeights, Residual
from nnterp_attention.attention import Attention

#: In the router's forward: the top-k of the logits, ``(values, indices)``.
TOP_K = "source.torch_topk_0.output"

NO_SLOTS = (
    "Llama-4's experts scale their inputs by the weights and run every expert on every token, so no tensor holds "
    "a routed slot's weighted output; read routed_output, or the experts' own outputs at experts.output "
    "([num_experts * tokens, hidden_size], zero where an expert was not routed)"
)
ORDER = (
    "Llama-4's mixture produces router_logits, then expert_weights and expert_indices (at the router's top-k), "
    "then shared_expert_output, then routed_output and mlp_output; read and write them in that order, or in "
    "separate traces"
)


def weight_logits(weights: torch.Tensor) -> torch.Tensor:
    """The logits whose sigmoid is ``weights``: what the router holds for a weight. Each must be in [0, 1]."""
    if ((weights < 0) | (weights > 1)).any():
        raise ValueError("expert_weights: a Llama-4 weight is a sigmoid, in [0, 1]; nothing was written")
    return torch.logit(weights.float()).to(weights.dtype)


def sigmoid(logits: torch.Tensor) -> torch.Tensor:
    """The weights of top-k ``logits``, computed as the router computes them."""
    return torch.sigmoid(logits.float()).to(logits.dtype)


class Llama4TextMoe(Moe):
    """Sigmoid of the top-k logits, scaling each expert's input; a shared expert the routed sum is added to."""

    SCORING = Scoring(function="sigmoid", after_top_k=True)
    LOGITS = "source.forward_0.output"
    SHARED = "shared_expert.output"
    # routed_output is an operation of this forward read after the router's values, once the forward has begun.
    sourced = True

    def order_hint(self, name: str) -> str:
        return ORDER

    @TokenEProperty(lambda moe: f"{moe.ROUTER}.{TOP_K}", select=1, unavailable=mixture_reason)
    def expert_indices(self, value: Any) -> ExpertIndices:
        """The experts each token is routed to, [batch, seq, top_k], integers: the indices of its top-k logits.

        Write an index to send that slot to another expert, with the slot's
        weight: the router scatters each slot's logit to its index. Two slots
        written to one expert run it once, with one of their weights. Assign
        or edit in place.
        """
        return value

    @TokenEProperty(lambda moe: f"{moe.ROUTER}.{TOP_K}", select=0, unavailable=mixture_reason)
    def expert_weights(self, value: Any) -> ExpertWeights:
        """The weights of each token's routing slots, [batch, seq, top_k]: the sigmoid of its top-k logits.

        What scales the slot's expert's *input* (not its output). The router
        holds the logits: a written weight goes back as its logit, so a
        weight must be in [0, 1], and zero closes the slot (its expert sees a
        zero input and gives a zero output). Assign or edit in place.
        """
        return sigmoid(value)

    @expert_weights.postprocess
    def expert_weights(self, weights: torch.Tensor) -> torch.Tensor:
        return weight_logits(weights)

    @expert_weights.transform
    def expert_weights(self, view: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        # The served weights are computed, not the router's tensor: an edited one goes back as its logit, into this
        # invoke's rows of the flat logits, and an unedited one leaves its logit as it was.
        total, start, size = invoke_rows("expert_weights")
        rows = logits.unflatten(0, (total, -1)).narrow(0, start, size)
        edited = view != sigmoid(rows)
        if edited.any():
            rows.copy_(torch.where(edited, weight_logits(view), rows))
        return logits

    expert_outputs = unavailable(NO_SLOTS)

    @TokenEProperty("source.sum_0.output", unavailable=mixture_reason)
    def routed_output(self, value: Any) -> Residual:
        """The routed experts' output, [batch, seq, hidden_size]: the experts' sum, before it is added to the shared expert's.

        Assign or edit in place.
        """
        return value

    @TokenEProperty(lambda moe: moe.SHARED, unavailable=no_shared_expert)
    def shared_expert_output(self, value: Any) -> Residual:
        """The shared expert's output, [batch, seq, hidden_size], as it returns it.

        ``routed_output + shared_expert_output == mlp_output``. Assign or edit
        in place.
        """
        return value

    @shared_expert_output.transform
    def shared_expert_output(self, view: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        # The forward adds the routed sum into this tensor in place: it goes on with a copy (edits included), so the
        # tensor read stays the shared expert's output.
        return output.clone()


MODEL_TYPES = ("llama4_text",)
ENVOYS = {
    MODELING.Llama4TextDecoderLayer: Layer,
    MODELING.Llama4TextAttention: Attention,
    MODELING.Llama4TextMoe: Llama4TextMoe,
    MODELING.Llama4TextMLP: Mlp,
}
RENAME = {"feed_forward": "mlp", "activation_fn": "act_fn"}
# interleave_moe_layer_step=2: block 0's MLP is dense, block 1's a mixture of experts.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=32,
    intermediate_size_mlp=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=2,
    interleave_moe_layer_step=2,
    max_position_embeddings=64,
)
