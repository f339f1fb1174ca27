"""nnterp-lightning: lightning attention (MiniMax) for nnterp."""

from .lightning_attention import LightningAttention

__all__ = ["LightningAttention"]
