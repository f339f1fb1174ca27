"""The nnterp-xlstm plugin: the xLSTM family, the names it adds to ``nnterp``, and the MatrixMemory suite."""

import nnterp

from .families import xlstm
from .matrix_memory import MatrixMemory


@nnterp.hookimpl
def nnterp_families():
    return [xlstm]


@nnterp.hookimpl
def nnterp_namespace():
    return {"MatrixMemory": MatrixMemory}


@nnterp.hookimpl
def nnterp_suites():
    from .testing import MatrixMemorySuite

    return {MatrixMemory: MatrixMemorySuite}
