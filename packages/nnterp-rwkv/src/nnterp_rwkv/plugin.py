"""The nnterp-rwkv plugin: the RWKV family, the names it adds to ``nnterp``, and the WKV suite."""

import nnterp

from .blocks import RwkvLayer
from .families import rwkv
from .wkv import Wkv


@nnterp.hookimpl
def nnterp_families():
    return [rwkv]


@nnterp.hookimpl
def nnterp_namespace():
    return {"Wkv": Wkv}


@nnterp.hookimpl
def nnterp_suites():
    from .testing import RwkvLayerSuite, WkvSuite

    return {Wkv: WkvSuite, RwkvLayer: RwkvLayerSuite}
