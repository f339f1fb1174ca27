"""nnterp-deltanet: gated-DeltaNet mixers (``LinearAttention``, Kimi's ``KimiDeltaAttention``) and their hybrid families."""

from .blocks import ExpertsMlp, HybridLayer, MissingMixer
from .linear_attention import KimiDeltaAttention, LinearAttention, route_delta_rule

__all__ = ["ExpertsMlp", "HybridLayer", "KimiDeltaAttention", "LinearAttention", "MissingMixer", "route_delta_rule"]
