"""nnterp-mamba: Mamba-1 selective scans (Mamba, Falcon-Mamba, Jamba, Zamba) under nnterp's standard names.

``SelectiveScan`` serves a Mamba-1 mixer's B, C, x, step sizes, decays and
state at the selective-scan kernel call its forward makes; the families
``mamba``, ``falcon_mamba``, ``jamba`` and ``zamba`` wrap their models' modules in it.
``nnterp_mamba.testing.SelectiveScanSuite`` is the conformance suite a family
with such a mixer mixes into its tests.
"""

from .selective_scan import SelectiveScan, needs_token_loop

__all__ = ["SelectiveScan", "needs_token_loop"]
