"""The nnterp-shortconv plugin: the gated short-convolution families, the names it adds to ``nnterp``, and its suite."""

import nnterp
from nnterp.registry import installed_families

from .families import lfm2, lfm2_moe
from .shortconv import ShortConv


@nnterp.hookimpl
def nnterp_families():
    # LFM3 ships from transformers 5.23
    return [lfm2, lfm2_moe, *installed_families("nnterp_shortconv.families.lfm3")]


@nnterp.hookimpl
def nnterp_namespace():
    return {"ShortConv": ShortConv}


@nnterp.hookimpl
def nnterp_suites():
    from .testing import ShortConvSuite

    return {ShortConv: ShortConvSuite}
