"""GraniteMoeHybrid (Granite 4.0-H): pre-norm blocks, a Mamba-2 mixer or softmax attention, then a mixture of experts beside a shared MLP.

Both sublayers are scaled by ``config.residual_multiplier`` before they join
the residual stream, so each contribution is the module's output times it:
``attention_output`` and ``mlp_output`` serve that product (a copy; an
assignment is divided back before it replaces the module's output).

The feed-forward is served on the shared MLP (``shared_mlp`` -> ``mlp``); the
experts are its sibling ``block_sparse_moe``, whose router picks the top-k
logits and takes the softmax of those k. The block adds ``(experts + shared
MLP) * residual_multiplier``: ``mlp_output == (routed_output +
shared_expert_output) * residual_multiplier``, the mixture's parts being the
model's own tensors (``Moe.mixture_output``). Without experts (``num_local_experts=0``)
the shared MLP is the whole feed-forward, with its own neurons.
"""

from __future__ import annotations

from typing import Any

from transformers.models.granitemoehybrid import modeling_granitemoehybrid as MODELING

from nnterp import EProperty, Mlp, Moe, Scoring
from nnterp.components.per_token import ChunkBoundaries
from nnterp.layouts import Neurons, Residual
from nnterp_attention.scaled import ScaledAttention
from nnterp_ssd.blocks import SourcedLayer
from nnterp_ssd.state_space import StateSpace

NO_EXPERTS = (
    "this model has no experts (num_local_experts=0): the shared MLP is the whole feed-forward, its output "
    "mlp_output, its neurons mlp_activation and mlp_neurons"
)
BESIDE_EXPERTS = (
    "the feed-forward is a mixture of experts plus a shared MLP, so the block has no single activation or down "
    "projection; read expert_outputs and shared_expert_output, or the modules under the block's block_sparse_moe"
)


def _residual_multiplier(envoy: Any) -> float:
    return envoy.parent._module.residual_multiplier


def _with_experts(envoy: Any) -> str | None:
    return BESIDE_EXPERTS if envoy.parent._module.has_experts else None


def _feed_forward(envoy: Any) -> str:
    """The block's feed-forward sum: the experts' output plus the shared MLP's, or the shared MLP's alone."""
    return "../source.hidden_states_4.output" if envoy.parent._module.has_experts else "output"


class GraniteMoeHybridStateSpace(StateSpace):
    """Granite's Mamba-2 mixer, at ``layers[i].mamba``; its chunk size comes from ``config.mamba_chunk_size``."""

    PER_TOKEN = ChunkBoundaries("mamba_chunk_size")

    @EProperty("output")
    def attention_output(self, value: Any) -> Residual:
        """What the mixer adds to the residual stream: its output times residual_multiplier, [batch, seq, hidden_size].

        A scaled copy: assign to replace it.
        """
        return value * _residual_multiplier(self)

    @attention_output.postprocess
    def attention_output(self, value: Any) -> Any:
        return value / _residual_multiplier(self)


class GraniteMoeHybridAttention(ScaledAttention):
    """Granite's softmax attention, whose contribution is scaled by residual_multiplier."""

    SCALE = "residual_multiplier"


class GraniteMoeHybridFeedForward(Moe):
    """The block's feed-forward, served on its shared MLP (``layers[i].mlp``): the experts' and the shared MLP's sum.

    The router and experts are the sibling ``block_sparse_moe``'s.
    ``mlp_output`` is the branches' sum times residual_multiplier, as the
    block adds it (a scaled copy, which an assignment replaces, divided
    back); ``routed_output``, ``expert_outputs`` and ``shared_expert_output``
    are the model's own tensors, before that scaling. ``mlp_activation`` and
    ``mlp_neurons`` are the shared MLP's own where it is the whole
    feed-forward (``num_local_experts=0``).
    """

    SCORING = Scoring(after_top_k=True)
    ROUTER = "../block_sparse_moe.router"
    EXPERTS = "../block_sparse_moe.experts"
    SHARED = "output"

    def no_mixture(self) -> str | None:
        return None if self.parent._module.has_experts else NO_EXPERTS

    @property
    def intermediate_size(self) -> int:
        """Width of one routed expert's hidden layer, or of the shared MLP's where it is the whole feed-forward."""
        return Mlp.intermediate_size.fget(self) if self.no_mixture() else Moe.intermediate_size.fget(self)

    @EProperty(_feed_forward)
    def mlp_output(self, value: Any) -> Residual:
        """What the feed-forward adds to the residual stream: (experts + shared MLP) times residual_multiplier, [batch, seq, hidden_size].

        A scaled copy: assign to replace it.
        """
        return value * _residual_multiplier(self)

    @mlp_output.postprocess
    def mlp_output(self, value: Any) -> Any:
        return value / _residual_multiplier(self)

    def mixture_output(self, routed: Any, shared: Any) -> Any:
        """What the block adds from the two branches: their sum times residual_multiplier."""
        return Moe.mixture_output(self, routed, shared) * _residual_multiplier(self)

    @EProperty("act_fn.output", unavailable=_with_experts)
    def mlp_activation(self, value: Any) -> Neurons:
        """The shared MLP's activation output, [batch, seq, intermediate_size]. Assign or edit in place."""
        return value

    @EProperty("down_proj.input", unavailable=_with_experts)
    def mlp_neurons(self, value: Any) -> Neurons:
        """What the shared MLP's output projection sums, act(gate) * up, [batch, seq, intermediate_size]. Assign or edit in place."""
        return value


MODEL_TYPES = ("granitemoehybrid",)
ENVOYS = {
    MODELING.GraniteMoeHybridDecoderLayer: SourcedLayer,
    MODELING.GraniteMoeHybridMambaLayer: GraniteMoeHybridStateSpace,
    MODELING.GraniteMoeHybridAttention: GraniteMoeHybridAttention,
    MODELING.GraniteMoeHybridMLP: GraniteMoeHybridFeedForward,
}
RENAME = {
    "mamba": "linear_attn",
    "shared_mlp": "mlp",
    "shared_mlp.activation": "shared_mlp.act_fn",
    "shared_mlp.output_linear": "shared_mlp.down_proj",
}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    shared_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    layer_types=["mamba", "attention"],
    mamba_n_heads=4,
    mamba_d_head=8,
    mamba_n_groups=2,
    mamba_d_state=4,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_chunk_size=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    residual_multiplier=0.5,
)
