"""The envoys of a hybrid's blocks around its mixers: the block itself, and a mixture-of-experts feed-forward."""

from __future__ import annotations

from typing import Any

from nnterp import Layer, Mlp, RecurrentMixer, Unavailable, unavailable

#: Where ``SelfAttnMixerLayer`` keeps its ``self_attn`` child, served only when it is softmax attention.
SELF_ATTN_CHILD = "_self_attn_child"
#: The standard names of a block's sequence mixer; a hybrid's block has one of them.
MIXERS = ("linear_attn", "self_attn")

NOT_MAPPED_EXPERTS = (
    "a mixture of experts: each expert has its own activation and down projection, so the block has no "
    "single one; read mlp_output, or the experts' modules under mlp"
)


class MissingMixer(Unavailable, AttributeError):
    """A hybrid block asked for the mixer it does not have.

    An ``AttributeError`` too, so ``getattr(layer, "linear_attn", None)`` is
    ``None`` on an attention block, as on any envoy.
    """


class HybridLayer(Layer):
    """A hybrid's decoder block: ``linear_attn`` (a recurrent mixer) or ``self_attn`` (softmax attention), never both.

    Which blocks have which follows ``config.layer_types``; decide it outside
    the trace (``nnterp.testing.blocks_with(model, "linear_attn")``). Asking a
    block for the mixer it lacks raises ``MissingMixer`` naming the one it has.
    """

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup found no such child: a mixer this block does not have.
        if name not in MIXERS:
            return super().__getattr__(name)
        layer_type = getattr(self.__dict__.get("_module"), "layer_type", None)
        kind = f" (a {layer_type} block)" if layer_type else ""
        other = next(mixer for mixer in MIXERS if mixer != name)
        raise MissingMixer(
            f"no {name} module on {self.path}{kind}: a hybrid's blocks have either linear_attn or self_attn, "
            f"following config.layer_types, and this one has {other}; pick the blocks outside the trace with "
            f"nnterp.testing.blocks_with(model, {name!r})"
        )


class SelfAttnMixerLayer(HybridLayer):
    """A hybrid block whose modeling code keeps either mixer at ``self_attn`` (Kimi-Linear, Bailing-Hybrid).

    The family's ``RENAME`` serves the recurrent child as ``linear_attn``;
    this block then serves ``self_attn`` only when it is softmax attention, so
    ``self_attn`` means softmax attention on every family and the block's
    contributions are counted once.
    """

    @property
    def self_attn(self) -> Any:
        """The block's softmax attention; a recurrent block has none: its mixer is ``linear_attn``."""
        child = self.__dict__.get(SELF_ATTN_CHILD)
        if child is None or isinstance(child, RecurrentMixer):
            # An AttributeError hands the lookup to HybridLayer.__getattr__, which raises MissingMixer.
            raise AttributeError("self_attn")
        return child

    @self_attn.setter
    def self_attn(self, child: Any) -> None:
        self.__dict__[SELF_ATTN_CHILD] = child


class ExpertsMlp(Mlp):
    """A sparse mixture-of-experts feed-forward: its contribution is ``mlp_output``, as on any ``Mlp``."""

    mlp_activation = unavailable(NOT_MAPPED_EXPERTS)
    mlp_neurons = unavailable(NOT_MAPPED_EXPERTS)
