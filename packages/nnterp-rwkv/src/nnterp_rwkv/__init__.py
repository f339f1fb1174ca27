"""nnterp-rwkv: RWKV-4's WKV linear attention under nnterp's standard names.

``Wkv`` serves an RWKV-4 time-mixing block's receptance, keys, values, decays,
bonus and its three-part state at the ``rwkv_linear_attention`` call its
forward makes; the family ``rwkv`` wraps RWKV models' modules in it.
``nnterp_rwkv.testing.WkvSuite`` is the conformance suite a family with such a
mixer mixes into its tests.
"""

from .wkv import Wkv

__all__ = ["Wkv"]
