"""Gemma-4's text model: Gemma-3's sandwich block, then a per-layer input, the stream scaled, and a mixture of experts.

After the attention and the feed-forward (each read after its post-norm, as on
Gemma-3), a block with ``hidden_size_per_layer_input`` adds a per-layer input
(PLE): the stream gated by the block's slice of the per-layer token
embeddings, projected and normalized by ``post_per_layer_input_norm``, served
as ``ple``. The block then multiplies the whole stream by its buffer
``layer_scalar``, after every addition (``stream_norms``), so
``layer_output == layer_scalar * (layer_input + attention_output + mlp_output
+ per_layer_output)``.

Where ``config.enable_moe_block``, the block runs a mixture of experts beside
its dense MLP, from its own ``router`` and ``experts``; the mixture's values
are served on ``mlp`` (``Gemma4Moe``).

Blocks differ in size: full-attention blocks have their own head width
(``global_head_dim``) and key/value heads, and with ``attention_k_eq_v`` their
values come from the key projection. The last ``num_kv_shared_layers`` blocks
project no keys or values: they attend over those of the last earlier block of
their type, which their attention interface receives and serves. That block
hands them its keys and values before its own interface call, so an
assignment to its ``attention_keys`` or ``attention_values`` changes its own
attention only, while an in-place edit reaches the blocks that reuse them.
Under ``generate`` from transformers 5.23 on, the blocks that reuse keys and
values run on the prompt's last position alone, so their values on the first
step are one position long.
"""

from __future__ import annotations

from typing import Any

from transformers.models.gemma4 import modeling_gemma4 as MODELING

from nnterp import EProperty, Mlp, Moe, Scoring, Sublayer, TokenEProperty, no_shared_expert
from nnterp.layouts import Residual
from nnterp_attention.post_norm import PostNormAttention, SandwichLayer
from nnterp_attention.shared_kv import refuse_skipping_a_kv_source

NO_MIXTURE = (
    "this checkpoint runs no mixture of experts (config.enable_moe_block is false): the block's feed-forward is its "
    "dense MLP alone"
)
MOE_ORDER = (
    "a Gemma-4 block runs its dense MLP first (mlp_activation, mlp_neurons, shared_expert_output), then its "
    "mixture of experts (router_logits, then expert_weights and expert_indices, then expert_outputs and "
    "routed_output), then mlp_output; read and write them in that order, or in separate traces"
)


class Gemma4Layer(SandwichLayer):
    """Gemma-4's block: a sandwich block whose stream the buffer ``layer_scalar`` multiplies after the last addition."""

    def stream_norms(self) -> tuple[str | None, ...]:
        """``layer_scalar`` after the last contribution: the per-layer input's where the block has one, else the MLP's."""
        additions = 3 if self._module.hidden_size_per_layer_input else 2
        return (None,) * (additions - 1) + ("layer_scalar",)

    def skip(self, hidden: Any) -> None:
        """Skip this block: it does not run, and ``hidden`` takes the place of its ``layer_output``.

        Refused on a block whose keys and values later blocks reuse
        (``num_kv_shared_layers``): they would find none.
        """
        refuse_skipping_a_kv_source(self)
        super().skip(hidden)


class Gemma4PerLayerInput(Sublayer):
    """The per-layer input (PLE), served at the last module of its branch, the norm whose output the block adds.

    ``post_per_layer_input_norm(per_layer_projection(act_fn(per_layer_input_gate(x)) * per_layer_input))``,
    where ``x`` is the stream after the feed-forward and ``per_layer_input`` the block's slice of the per-layer
    token embeddings.
    """

    @EProperty("output")
    def per_layer_output(self, value: Any) -> Residual:
        """What the per-layer input adds to the residual stream, [batch, seq, hidden_size]. Assign or edit in place."""
        return value


class Gemma4Moe(Moe):
    """The block's feed-forward: its dense MLP and, where the checkpoint has one, the block's mixture of experts beside it.

    The router and the experts are the block's children, not the MLP's. Both
    branches read the stream between the sublayers, the MLP through
    ``pre_feedforward_layernorm``, the experts through
    ``pre_feedforward_layernorm_2``. The router takes a softmax of its
    ``proj`` logits, keeps the top ``config.top_k_experts``, renormalizes
    them and multiplies each by ``per_expert_scale`` at its expert.

    The block normalizes each branch, adds them, and normalizes the sum::

        mlp_output == post_feedforward_layernorm(post_feedforward_layernorm_1(shared_expert_output)
                                                 + post_feedforward_layernorm_2(routed_output))

    so ``routed_output + shared_expert_output`` is not ``mlp_output``. The
    dense MLP's own values (``mlp_activation``, ``mlp_neurons``, over its
    ``intermediate_size``) are served as on any gated MLP.
    """

    CONTRIBUTION = "../post_feedforward_layernorm.output"
    SCORING = Scoring(normalize=True, expert_scale="per_expert_scale")
    ROUTER = "../router"
    LOGITS = "proj.output"
    EXPERTS = "../experts"
    SHARED = "output"

    mlp_activation = Mlp.mlp_activation
    mlp_neurons = Mlp.mlp_neurons
    intermediate_size = Mlp.intermediate_size

    def no_mixture(self) -> str | None:
        """Why this block runs no mixture of experts (its ``enable_moe_block`` is off), or ``None``."""
        return None if self.parent._module.enable_moe_block else NO_MIXTURE

    def order_hint(self, name: str) -> str:
        """The order the block's forward produces the feed-forward's values in, for an out-of-order error."""
        return MOE_ORDER

    @property
    def top_k(self) -> int:
        """Experts each token is routed to: ``config.top_k_experts``, as the router reads it."""
        return self.router_module().config.top_k_experts

    def mixture_output(self, routed: Any, shared: Any) -> Any:
        """Each branch normalized, then their sum: ``mlp_output`` from ``routed_output`` and ``shared_expert_output``."""
        block = self.parent._module
        branches = block.post_feedforward_layernorm_1(shared) + block.post_feedforward_layernorm_2(routed)
        return block.post_feedforward_layernorm(branches)

    @TokenEProperty(lambda moe: moe.SHARED, unavailable=no_shared_expert)
    def shared_expert_output(self, value: Any) -> Residual:
        """The dense MLP's output, [batch, seq, hidden_size]: the branch every token runs beside the routed experts.

        Before ``post_feedforward_layernorm_1``, as ``routed_output`` is before
        ``post_feedforward_layernorm_2``. Assign or edit in place.
        """
        return value


MODEL_TYPES = ("gemma4_text",)
#: The per-layer input is added after the feed-forward.
CONTRIBUTIONS = (("self_attn", "attention_output"), ("mlp", "mlp_output"), ("ple", "per_layer_output"))
ENVOYS = {
    MODELING.Gemma4TextDecoderLayer: Gemma4Layer,
    MODELING.Gemma4TextAttention: PostNormAttention,
    MODELING.Gemma4TextMLP: Gemma4Moe,
    "post_per_layer_input_norm": Gemma4PerLayerInput,
}
RENAME = {"post_per_layer_input_norm": "ple"}
TINY_CONFIG = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    sliding_window=64,  # longer than the test prompts, so every pattern is the full causal one
    layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"],
    num_kv_shared_layers=1,  # the last block attends over the third's keys and values
    use_double_wide_mlp=True,  # and its MLP is twice as wide
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=64,
    enable_moe_block=True,  # off by default
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=16,
)
