"""nnterp-attention: softmax attention (``Attention``) and the softmax-attention families."""

from .attention import NOT_EAGER, Attention, interface_reason

__all__ = ["Attention", "NOT_EAGER", "interface_reason"]
