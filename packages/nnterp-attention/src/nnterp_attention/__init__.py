"""nnterp-attention: softmax attention (``Attention``) and the softmax-attention families."""

from .attention import NOT_EAGER, Attention, off_interface

__all__ = ["Attention", "NOT_EAGER", "off_interface"]
