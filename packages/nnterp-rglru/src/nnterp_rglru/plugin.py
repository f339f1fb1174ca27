"""The nnterp-rglru plugin: the RecurrentGemma family, the names it adds to ``nnterp``, and its mixers' suites."""

import nnterp

from .families import recurrent_gemma
from .local_attention import LocalAttention
from .rg_lru import RgLru


@nnterp.hookimpl
def nnterp_families():
    return [recurrent_gemma]


@nnterp.hookimpl
def nnterp_namespace():
    return {"RgLru": RgLru, "LocalAttention": LocalAttention}


@nnterp.hookimpl
def nnterp_suites():
    from .testing import LocalAttentionSuite, RgLruSuite

    return {RgLru: RgLruSuite, LocalAttention: LocalAttentionSuite}
