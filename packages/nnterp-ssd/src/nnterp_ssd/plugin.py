"""The nnterp-ssd plugin: Mamba-2 (SSD) mixers and the families built on them."""

import nnterp

from .families import bamba, falcon_h1, granitemoehybrid, mamba2, nemotron_h, zamba2
from .state_space import StateSpace, chunk_per_token


@nnterp.hookimpl
def nnterp_families():
    return [mamba2, nemotron_h, bamba, falcon_h1, zamba2, granitemoehybrid]


@nnterp.hookimpl
def nnterp_namespace():
    return {"chunk_per_token": chunk_per_token}


@nnterp.hookimpl
def nnterp_suites():
    from .testing import SSDSuite

    return {StateSpace: SSDSuite}
