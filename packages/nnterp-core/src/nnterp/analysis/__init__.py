"""Analyses over the standard values, exact and the same on every family.

- :mod:`.mixing`: a sequence mixer's exact token-to-token matrix (``token_mixing`` on every
  recurrent mixer and attention) and the identity it satisfies.
- :mod:`.knockout`: take a token out of what later tokens read (``knock_out`` in a trace,
  ``knockout`` over positions).
- :mod:`.patching`: continue a target prompt from a source prompt's state (``patch_state``).
- :mod:`.attribution`: a first-order estimate of patching every value at every position
  (``attribution_patch``).
- :mod:`.tracing`: corrupt a subject and restore one value at one (layer, position)
  (``causal_trace``).
- :mod:`.lens`: the model's own head on any block's stream (``unembed``, ``logit_lens``), and
  a vector added to a standard value (``steer``).
"""

from .attribution import attribution_patch
from .knockout import knock_out, knockout, last_logits
from .lens import logit_lens, steer, unembed
from .mixing import Heads, TokenMixing, mixed, select_heads, selected_mixing
from .patching import patch_state
from .tracing import CausalTrace, causal_trace

__all__ = [
    "CausalTrace",
    "attribution_patch",
    "causal_trace",
    "Heads",
    "TokenMixing",
    "knock_out",
    "knockout",
    "last_logits",
    "logit_lens",
    "mixed",
    "patch_state",
    "select_heads",
    "selected_mixing",
    "steer",
    "unembed",
]
