"""Families with lightning-attention mixers."""
