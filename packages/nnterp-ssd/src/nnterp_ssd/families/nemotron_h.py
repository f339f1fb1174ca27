"""Nemotron-H: single-sublayer blocks, x + sublayer(norm(x)), whose one sublayer is a Mamba-2 mixer, softmax attention, an MLP or a mixture of experts.

Every block holds its sublayer at ``mixer`` whatever it is, so the standard
name follows the sublayer's class: ``linear_attn``, ``self_attn`` or
``mlp``. The values of a sublayer a block does not hold are unavailable on it.

The router (``gate`` -> ``router``) scores every expert with a sigmoid, picks
the top-k of the scores plus ``e_score_correction_bias`` within the best
``topk_group`` of ``n_group`` groups, and weighs them by the plain scores,
renormalized where ``norm_topk_prob`` says, times ``routed_scaling_factor``.
The experts run between ``fc1_latent_proj`` and ``fc2_latent_proj``, which
project into and out of a ``moe_latent_size``-wide space where the config sets
one and are ``nn.Identity`` where it does not (the default). The shared
experts (``shared_experts``, one MLP) run on the block's input and are added
ungated.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers.models.nemotron_h import modeling_nemotron_h as MODELING

from nnterp import EProperty, Layer, Mlp, Moe, Scoring, TokenEProperty, unavailable
from nnterp.components.moe import EXPERTS_CALL, SLOT_OUTPUTS, mixture_reason, needs_grouped_experts
from nnterp.layouts import ExpertOutputs, Residual
from nnterp_attention import Attention
from nnterp_ssd.state_space import StateSpace

ONE_SUBLAYER = "a single-sublayer block, x + sublayer(norm(x)): there is no stream between two sublayers"
MIXER_BLOCK = "a sequence-mixer block: its one norm feeds the mixer (attention_norm_output), and it has no MLP"
MLP_BLOCK = "an MLP block: its one norm feeds the MLP (mlp_norm_output), and it has no sequence mixer"
LATENT = (
    "the experts run in the moe_latent_size-wide space between fc1_latent_proj and fc2_latent_proj, so each "
    "slot's output is neither hidden_size wide nor what the block adds; read routed_output, their sum brought back "
    "to hidden_size by fc2_latent_proj"
)


def _mlp_block(envoy: Any) -> str | None:
    return MLP_BLOCK if "mlp" in envoy._aliases else None


def _mixer_block(envoy: Any) -> str | None:
    return None if "mlp" in envoy._aliases else MIXER_BLOCK


class NemotronHLayer(Layer):
    """A Nemotron-H block: its ``norm`` feeds whichever sublayer it holds."""

    @EProperty("norm.output", unavailable=_mlp_block)
    def attention_norm_output(self, value: Any) -> Residual:
        """What the sequence mixer is called with: the block's norm's output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value

    @EProperty("norm.output", unavailable=_mixer_block)
    def mlp_norm_output(self, value: Any) -> Residual:
        """What the MLP is called with: the block's norm's output, [batch, seq, hidden_size]. Assign or edit in place."""
        return value

    @EProperty("mlp.input", unavailable=_mixer_block)
    def mlp_input(self, value: Any) -> Residual:
        """What the MLP is called with, [batch, seq, hidden_size]: the same tensor as mlp_norm_output. Assign or edit in place."""
        return value

    layer_mid = unavailable(ONE_SUBLAYER)


def _latent_slots(moe: Moe) -> str | None:
    if not isinstance(moe._module.fc2_latent_proj, nn.Identity):
        return LATENT
    return needs_grouped_experts(moe)


class NemotronHMoe(Moe):
    """Grouped sigmoid routing with a selection bias, renormalized and scaled; experts in an optional latent width; ungated shared experts."""

    SCORING = Scoring(
        function="sigmoid", normalize="norm_topk_prob", bias="e_score_correction_bias", scale="routed_scaling_factor"
    )
    SHARED = "shared_experts.output"

    @TokenEProperty(
        lambda moe: f"{moe.EXPERTS}.source.{EXPERTS_CALL}.source.{SLOT_OUTPUTS}.output", unavailable=_latent_slots
    )
    def expert_outputs(self, value: Any) -> ExpertOutputs:
        """Each slot's expert output times its weight, [batch, seq, top_k, hidden_size], before the slots are summed.

        Served where the latent projections are ``nn.Identity``, so the
        experts work in hidden_size and ``expert_outputs.sum(2) ==
        routed_output``. Assign or edit in place: the sum is taken of what is
        written.
        """
        return value

    @TokenEProperty("fc2_latent_proj.output", unavailable=mixture_reason)
    def routed_output(self, value: Any) -> Residual:
        """The routed experts' contribution, [batch, seq, hidden_size]: their sum after ``fc2_latent_proj``.

        The sum itself where the projection is ``nn.Identity``. Assign or edit
        in place.
        """
        return value


MODEL_TYPES = ("nemotron_h",)
ENVOYS = {
    MODELING.NemotronHBlock: NemotronHLayer,
    MODELING.NemotronHMamba2Mixer: StateSpace,
    MODELING.NemotronHAttention: Attention,
    MODELING.NemotronHMLP: Mlp,
    MODELING.NemotronHMoE: NemotronHMoe,
}
RENAME = {
    MODELING.NemotronHMamba2Mixer: "linear_attn",
    MODELING.NemotronHAttention: "self_attn",
    MODELING.NemotronHMLP: "mlp",
    MODELING.NemotronHMoE: "mlp",
    MODELING.NemotronHTopkRouter: "router",
    "model.embeddings": "embed_tokens",
    "model.norm_f": "ln_final",
}
# One block of each kind; the mixture's eight experts fall in four groups, two of them kept per token.
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=16,
    num_hidden_layers=4,
    layers_block_type=["mamba", "attention", "mlp", "moe"],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    intermediate_size=32,
    mamba_num_heads=4,
    mamba_head_dim=8,
    ssm_state_size=4,
    n_groups=2,
    conv_kernel=4,
    expand=2,
    chunk_size=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=16,
)
