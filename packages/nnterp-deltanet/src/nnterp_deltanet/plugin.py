"""The nnterp-deltanet plugin: gated-DeltaNet mixers and the hybrid families built on them."""

import nnterp

from .families import kimi_linear, olmo_hybrid, qwen3_5_moe, qwen3_5_text, qwen3_next
from .linear_attention import LinearAttention, route_delta_rule


@nnterp.hookimpl
def nnterp_families():
    return [qwen3_next, qwen3_5_text, qwen3_5_moe, olmo_hybrid, kimi_linear]


@nnterp.hookimpl
def nnterp_namespace():
    return {"route_delta_rule": route_delta_rule}


@nnterp.hookimpl
def nnterp_suites():
    from .testing import DeltaNetSuite

    return {LinearAttention: DeltaNetSuite}
