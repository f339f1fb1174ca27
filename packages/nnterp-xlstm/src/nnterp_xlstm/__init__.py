"""nnterp-xlstm: xLSTM's mLSTM matrix memory under nnterp's standard names.

``MatrixMemory`` serves an mLSTM layer's queries, keys, values, gates, head
outputs and its (C, n, m) state at the layer's call of its backend module; the
family ``xlstm`` wraps the model's modules in it.
``nnterp_xlstm.testing.MatrixMemorySuite`` is the conformance suite a family
with such a layer mixes into its tests.
"""

from .matrix_memory import MatrixMemory

__all__ = ["MatrixMemory"]
