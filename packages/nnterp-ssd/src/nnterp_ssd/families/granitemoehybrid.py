"""GraniteMoeHybrid (Granite 4.0-H): pre-norm blocks, a Mamba-2 mixer or softmax attention, then a mixture of experts beside a shared MLP.

Both sublayers are scaled by ``config.residual_multiplier`` before they join
the residual stream, so each contribution is the module's output times it:
``attention_output`` and ``mlp_output`` serve that product (a copy; an
assignment is divided back before it replaces the module's output).
"""

from __future__ import annotations

from typing import Any

from transformers.models.granitemoehybrid import modeling_granitemoehybrid as MODELING

from nnterp import EProperty, Mlp
from nnterp.components.per_token import ChunkBoundaries
from nnterp.layouts import Neurons, Residual
from nnterp_attention.scaled import ScaledAttention
from nnterp_ssd.blocks import SourcedLayer
from nnterp_ssd.state_space import StateSpace

BESIDE_EXPERTS = (
    "the feed-forward is a mixture of experts plus a shared MLP, so the block has no single activation or down "
    "projection; read mlp_output, or the modules under the block's block_sparse_moe"
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


class GraniteMoeHybridFeedForward(Mlp):
    """The block's feed-forward, served on its shared MLP (``layers[i].mlp``): the experts' and the shared MLP's sum.

    ``mlp_activation`` and ``mlp_neurons`` are the shared MLP's own where
    it is the whole feed-forward (``num_local_experts=0``).
    """

    @EProperty(_feed_forward)
    def mlp_output(self, value: Any) -> Residual:
        """What the feed-forward adds to the residual stream: (experts + shared MLP) times residual_multiplier, [batch, seq, hidden_size].

        A scaled copy: assign to replace it.
        """
        return value * _residual_multiplier(self)

    @mlp_output.postprocess
    def mlp_output(self, value: Any) -> Any:
        return value / _residual_multiplier(self)

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
