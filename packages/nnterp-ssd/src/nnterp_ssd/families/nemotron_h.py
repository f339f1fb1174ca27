"""Nemotron-H: single-sublayer blocks, x + sublayer(norm(x)), whose one sublayer is a Mamba-2 mixer, softmax attention, an MLP or a mixture of experts.

Every block holds its sublayer at ``mixer`` whatever it is, so the standard
name follows the sublayer's class: ``linear_attn``, ``self_attn`` or
``mlp``. The values of a sublayer a block does not hold are unavailable on it.
"""

from __future__ import annotations

from typing import Any

from transformers.models.nemotron_h import modeling_nemotron_h as MODELING

from nnterp import EProperty, Layer, Mlp, unavailable
from nnterp.layouts import Residual
from nnterp_attention import Attention
from nnterp_ssd.state_space import StateSpace

ONE_SUBLAYER = "a single-sublayer block, x + sublayer(norm(x)): there is no stream between two sublayers"
MIXER_BLOCK = "a sequence-mixer block: its one norm feeds the mixer (attention_norm_output), and it has no MLP"
MLP_BLOCK = "an MLP block: its one norm feeds the MLP (mlp_norm_output), and it has no sequence mixer"
EXPERTS = (
    "a mixture of experts: each expert has its own activation and output projection, so the block has no single "
    "one; read mlp_output, or the experts' modules under mlp"
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


class NemotronHExperts(Mlp):
    """Nemotron-H's mixture of experts (routed experts plus a shared one); its contribution is ``mlp_output``."""

    mlp_activation = unavailable(EXPERTS)
    mlp_neurons = unavailable(EXPERTS)


MODEL_TYPES = ("nemotron_h",)
ENVOYS = {
    MODELING.NemotronHBlock: NemotronHLayer,
    MODELING.NemotronHMamba2Mixer: StateSpace,
    MODELING.NemotronHAttention: Attention,
    MODELING.NemotronHMLP: Mlp,
    MODELING.NemotronHMoE: NemotronHExperts,
}
RENAME = {
    MODELING.NemotronHMamba2Mixer: "linear_attn",
    MODELING.NemotronHAttention: "self_attn",
    MODELING.NemotronHMLP: "mlp",
    MODELING.NemotronHMoE: "mlp",
    "model.embeddings": "embed_tokens",
    "model.norm_f": "ln_final",
}
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
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=16,
)
