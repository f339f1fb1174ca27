"""The nnterp-deltanet plugin: gated-DeltaNet mixers and the hybrid families built on them."""

import nnterp
from nnterp.registry import installed_families

from .families import glm5_next, kimi_linear, olmo_hybrid, qwen3_5, qwen3_5_moe, qwen3_5_text, qwen3_next
from .linear_attention import LinearAttention, route_delta_rule


@nnterp.hookimpl
def nnterp_families():
    # Bailing-Hybrid ships from transformers 5.20, Lara-mini from 5.24
    later = installed_families(
        "nnterp_deltanet.families.bailing_hybrid",
        "nnterp_deltanet.families.lara_mini",
        "nnterp_deltanet.families.qwen4_exp_text",
    )
    return [qwen3_next, qwen3_5_text, qwen3_5, qwen3_5_moe, olmo_hybrid, kimi_linear, glm5_next, *later]


@nnterp.hookimpl
def nnterp_namespace():
    return {"route_delta_rule": route_delta_rule}


@nnterp.hookimpl
def nnterp_suites():
    from .families.glm5_next import Glm5NextVisionAttention
    from .testing import DeltaNetSuite, Glm5NextVisionSuite

    return {LinearAttention: DeltaNetSuite, Glm5NextVisionAttention: Glm5NextVisionSuite}
