"""MiniMaxLayer: a block that keeps either mixer at ``self_attn`` and weights its normed residual stream."""

from __future__ import annotations

from typing import Any

from nnterp import Layer, Unavailable

from .lightning_attention import LightningAttention

#: Where ``MiniMaxLayer`` keeps its ``self_attn`` child, served only when it is softmax attention.
SELF_ATTN_CHILD = "_self_attn_child"


class MissingMixer(Unavailable, AttributeError):
    """A lightning block asked for softmax attention; an ``AttributeError`` too, so ``getattr(block, name, None)`` works."""


class MiniMaxLayer(Layer):
    """A MiniMax block: ``linear_attn`` (lightning attention) or ``self_attn`` (softmax attention), never both.

    The modeling code keeps either mixer at ``self_attn``; the family's
    ``RENAME`` serves the lightning one as ``linear_attn``, and this block
    serves ``self_attn`` only when it is softmax attention, so each block's
    mixer is counted once. The block's residual is weighted (see
    :func:`residual_factors`): ``layer_input + attention_output + mlp_output``
    is not ``layer_output`` here.
    """

    @property
    def self_attn(self) -> Any:
        """The block's softmax attention; a lightning block has none: its mixer is ``linear_attn``."""
        child = self.__dict__.get(SELF_ATTN_CHILD)
        if child is None or isinstance(child, LightningAttention):
            # an AttributeError hands the lookup to __getattr__, which names the mixer the block has
            raise AttributeError("self_attn")
        return child

    @self_attn.setter
    def self_attn(self, child: Any) -> None:
        self.__dict__[SELF_ATTN_CHILD] = child

    def __getattr__(self, name: str) -> Any:
        if name != "self_attn":
            return super().__getattr__(name)
        raise MissingMixer(
            f"no self_attn module on {self.path} (a linear_attention block): its mixer is lightning attention, "
            f"served as linear_attn; pick the blocks outside the trace with "
            f"nnterp.testing.blocks_with(model, 'self_attn')"
        )


def residual_factors(block: Layer) -> tuple[float, float, float, float]:
    """A MiniMax block's (alpha_attn, beta_attn, alpha_mlp, beta_mlp): how it weights the normed stream and each sublayer.

    ``layer_mid == alpha_attn * attention_norm_output + beta_attn * attention_output`` and
    ``layer_output == alpha_mlp * mlp_norm_output + beta_mlp * mlp_output``.
    """
    module = block._module
    return module.attn_alpha_factor, module.attn_beta_factor, module.mlp_alpha_factor, module.mlp_beta_factor
