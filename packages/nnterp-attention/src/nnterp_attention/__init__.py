"""nnterp-attention: softmax attention (``Attention``) and the softmax-attention families."""

from .attention import NOT_EAGER, Attention, interface_reason
from .vision import VisionAttention

__all__ = ["Attention", "NOT_EAGER", "VisionAttention", "interface_reason"]
