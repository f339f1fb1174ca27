"""The memory a mixer's per-token states are written into, kept from one trace to the next.

A routed mixer's ``states`` are large: a gated DeltaNet's take 1 MiB per token
per mixer (16 heads of 128 x 128 float32), so 1 GiB at 1024 tokens. Written
into fresh memory every trace, the first write costs about as much as the token
loop itself, because the operating system maps the memory in page by page. So
each mixer module keeps the storage its last states were written to, and the
next trace's states reuse it once nothing refers to it any more.
"""

from __future__ import annotations

import math
import weakref

import torch

#: Each mixer module's storage for its per-token states, freed with the module.
_KEPT: weakref.WeakKeyDictionary[torch.nn.Module, torch.UntypedStorage] = weakref.WeakKeyDictionary()


def reusable_states(owner: torch.nn.Module, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialized tensor of ``shape``, with ``like``'s dtype and device, in the memory ``owner``'s last one used.

    The kept storage is reused only when no tensor views it any more: neither
    the states handed out by an earlier trace nor any slice of them. While one
    does (a user kept them), the states get fresh memory, which becomes what
    the module keeps. So states a user holds never change, and at most one
    set of states per mixer outlives its traces, until the module is freed.
    States that record a gradient must not come from here: autograd tracks
    writes into a tensor, not into its storage.
    """
    numel = math.prod(shape)
    kept = _KEPT.get(owner)
    reusable = (
        kept is not None
        and kept.device == like.device
        and kept.nbytes() >= numel * like.element_size()
        # the kept storage object's own reference is the only one: no tensor views it (torch's CUDA graph trees
        # ask the same of their outputs' storages)
        and torch._C._storage_Use_Count(kept._cdata) == 1
    )
    if not reusable:
        kept = torch.empty(numel, dtype=like.dtype, device=like.device).untyped_storage()
        _KEPT[owner] = kept
    return like.new_empty(0).set_(kept, 0, shape)
