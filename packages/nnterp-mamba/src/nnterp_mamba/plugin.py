"""The nnterp-mamba plugin: the Mamba-1 families, the names it adds to ``nnterp``, and the SelectiveScan suite."""

import nnterp

from .families import falcon_mamba, jamba, mamba, zamba
from .selective_scan import SelectiveScan, needs_token_loop


@nnterp.hookimpl
def nnterp_families():
    return [mamba, falcon_mamba, jamba, zamba]


@nnterp.hookimpl
def nnterp_namespace():
    return {"SelectiveScan": SelectiveScan, "needs_token_loop": needs_token_loop}


@nnterp.hookimpl
def nnterp_suites():
    from .testing import SelectiveScanSuite

    return {SelectiveScan: SelectiveScanSuite}
