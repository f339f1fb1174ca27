"""nnterp-deltanet: gated-DeltaNet mixers (``LinearAttention``, Kimi's ``KimiDeltaAttention``) and their hybrid families."""

from .blocks import HybridLayer, MissingMixer
from .linear_attention import KimiDeltaAttention, LinearAttention, route_delta_rule

__all__ = ["HybridLayer", "KimiDeltaAttention", "LinearAttention", "MissingMixer", "route_delta_rule"]
