"""The nnterp-lightning plugin: the MiniMax family, the name it adds to ``nnterp``, and the LightningAttention suite."""

import nnterp

from .block import MiniMaxLayer
from .families import minimax
from .lightning_attention import LightningAttention


@nnterp.hookimpl
def nnterp_families():
    return [minimax]


@nnterp.hookimpl
def nnterp_namespace():
    return {"LightningAttention": LightningAttention}


@nnterp.hookimpl
def nnterp_suites():
    from .testing import LightningAttentionSuite, MiniMaxLayerSuite

    return {LightningAttention: LightningAttentionSuite, MiniMaxLayer: MiniMaxLayerSuite}
