"""Analyses over the standard values, exact and the same on every family.

- :mod:`.mixing`: a sequence mixer's exact token-to-token matrix (``token_mixing`` on every
  recurrent mixer and attention) and the identity it satisfies.
"""

from .mixing import Heads, TokenMixing, mixed, select_heads, selected_mixing

__all__ = ["Heads", "TokenMixing", "mixed", "select_heads", "selected_mixing"]
