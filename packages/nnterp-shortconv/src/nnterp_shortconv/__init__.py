"""nnterp-shortconv: gated short convolutions (LFM2, LFM2-MoE, LFM3) under nnterp's standard names.

``ShortConv`` serves a gated short convolution's gates B and C, its values x,
the conv's input and output and its window state, read in its forward and at
the conv call it makes; the families ``lfm2``, ``lfm2_moe`` and, where the
installed transformers has it, ``lfm3`` wrap their models' modules in it.
``nnterp_shortconv.testing.ShortConvSuite`` is the conformance suite a family
with such a mixer mixes into its tests.
"""

from .shortconv import ShortConv

__all__ = ["ShortConv"]
