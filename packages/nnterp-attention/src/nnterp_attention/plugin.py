"""The nnterp-attention plugin: softmax attention and its families."""

import nnterp

from .families import llama


@nnterp.hookimpl
def nnterp_families():
    return [llama]
