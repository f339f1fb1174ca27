"""nnterp-rglru: Griffin / RecurrentGemma's RG-LRU under nnterp's standard names.

``RgLru`` serves an RG-LRU's gates, inputs, outputs and state at the scan call
its forward makes (a method, ``self._rnn_scan``); the family
``recurrent_gemma`` wraps its model's modules in it, and its local-attention
blocks in ``LocalAttention`` (nnterp-attention's ``Attention`` over a sliding
window). ``nnterp_rglru.testing`` holds the conformance suites a family with
such mixers mixes into its tests, ``RgLruSuite`` and ``LocalAttentionSuite``.
"""

from .local_attention import LocalAttention
from .rg_lru import RgLru
from .scan import rglru_mixing, rglru_states

__all__ = ["LocalAttention", "RgLru", "rglru_mixing", "rglru_states"]
