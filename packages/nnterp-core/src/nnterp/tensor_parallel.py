"""Tensor parallelism: which values a model split across ranks serves, and the shim nnsight needs for it.

Under transformers' tensor parallelism (``distributed_config=``, one process
per rank) each rank holds a slice of every split projection: a block's
attention computes ``num_heads / tp_size`` heads, its MLP
``intermediate_size / tp_size`` neurons, and the projections after them
all-reduce, so the residual stream, the sublayers' contributions and the
logits are whole on every rank. nnsight shows whole tensors at the boundaries
of the split modules (its TP envoys); a value read inside a module, at one of
its operations (the queries at the attention interface, a recurrent mixer's
kernel arguments), is this rank's slice. nnterp does not gather those yet, so
they are unavailable under tensor parallelism, with the reason, rather than
served as a slice: the values whose layout has an axis other than the batch,
the positions, the hidden width, the vocabulary, a top-k slot or a residual
stream.
"""

from __future__ import annotations

from typing import Any

from .layouts import BATCH, HIDDEN, KEY, QUERY, SEQ, STREAMS, TOP_K, VOCAB

#: Axes every rank holds whole.
WHOLE_AXES = frozenset({BATCH, SEQ, QUERY, KEY, HIDDEN, VOCAB, TOP_K, STREAMS})

SLICED = (
    "the model is split across {ranks} ranks by tensor parallelism, and each holds a slice of this value's "
    "{axes} axis; nnterp does not gather it, so it is not served rather than served as one rank's slice. "
    "Read it on a model loaded without distributed_config, or read what the split modules return whole "
    "(the sublayers' outputs, the residual stream, the logits)"
)


def ranks(model: Any) -> int:
    """How many ranks the model envoy ``model`` is split across by tensor parallelism: 1 when it is not.

    Read off the loaded model's device mesh, or, before nnsight loads the
    weights, off the ``distributed_config`` it will load them with.
    """
    module = model._module
    mesh = getattr(module, "_device_mesh", None)
    if mesh is not None and getattr(module, "_tp_plan", None):
        return mesh.size()
    config = getattr(model, "kwargs", {}).get("distributed_config")
    return getattr(config, "tp_size", None) or 1


def sliced_reason(dims: tuple[str, ...] | None, model: Any) -> str | None:
    """Why a value laid out over ``dims`` is not served on the model envoy ``model``, or ``None``."""
    split = ranks(model)
    if split == 1:
        return None
    axes = sorted(set(dims or ("unknown",)) - WHOLE_AXES)
    return SLICED.format(ranks=split, axes=", ".join(axes)) if axes else None


def shim_nnsight() -> None:
    """Give transformers' tensor-parallel module the names nnsight 0.8 imports from it.

    nnsight reads a module's parallel style with
    ``transformers.distributed.tensor_parallel._get_parameter_plan``, which
    transformers 5.23 moved to ``parallel_utils``. (Before 5.19 nnsight
    refuses tensor parallelism itself, naming the version it needs.) Remove
    when nnsight follows.
    """
    from transformers.distributed import tensor_parallel

    if not hasattr(tensor_parallel, "_get_parameter_plan"):
        from transformers.distributed.parallel_utils import _get_parameter_plan

        tensor_parallel._get_parameter_plan = _get_parameter_plan
