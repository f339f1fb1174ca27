"""Train a SAELens SAE on a capture: one value's rows, written as SAELens's cached activations.

::

    from sae_lens import ActivationsStore, SAETrainer, StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig
    from nnterp.capture import Activations
    from nnterp.capture.saelens import store_kwargs, to_saelens

    path = to_saelens(Activations("acts/"), "layers[8].layer_output", "acts-saelens/")
    store = ActivationsStore(**store_kwargs(path, train_batch_size_tokens=4096))
    sae = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=store.d_in, d_sae=16 * store.d_in))
    config = SAETrainerConfig(total_training_samples=10**8, train_batch_size_samples=4096, lr=3e-4, lr_end=3e-5)
    SAETrainer(config, sae, store).fit().save_inference_model("sae/")

:func:`to_saelens` writes what SAELens's ``CacheActivationsRunner`` writes: a
``datasets`` dataset on disk, one record per sequence, the value under its key
as a ``[context, d_in]`` array and the sequence's ``token_ids`` beside it, so
SAELens reads it as it reads its own cache, with no model loaded. The rows are
reordered by the token each says it is, and any axes after the token axis (an
attention value's heads) are flattened into ``d_in``, as SAELens flattens them.
:func:`store_kwargs` gives an ``ActivationsStore`` everything the dataset fixes.
``SAETrainer`` takes the store as its data; its config wants ``lr_end`` given
(SAELens's own runner config fills it in, ``SAETrainerConfig`` does not).

Tested against SAELens 6.54.12 (``sae-lens==6.54.12``).
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from .reader import Activations
from .values import CaptureError

#: The SAELens release this module is tested against.
SAELENS_VERSION = "6.54.12"
#: Where the per-shard datasets wait, inside the output directory, until they are joined.
PARTS = ".nnterp-parts"
#: A dtype Arrow cannot hold is written as the one that holds it exactly.
ARROW_DTYPES = {"bfloat16": "float32"}


def to_saelens(activations: Activations | str | os.PathLike, key: str, out: str | os.PathLike) -> str:
    """Write the rows of ``key`` (as in ``activations.values``) to ``out`` as SAELens cached activations; returns ``out``.

    The dataset has one record per captured sequence: a column named ``key``,
    ``Array2D(shape=(context, d_in))``, and ``token_ids``, ``context`` int32s,
    the Features SAELens's ``CacheActivationsRunner`` writes. It is built shard
    by shard, so memory holds about one shard; the disk holds the data twice
    until the parts are joined. Only the shards the manifest lists are read (a
    capture still running gives the sequences written so far). ``bfloat16``
    rows are written as ``float32``, which Arrow holds and which keeps them
    exactly.

    Raises:
        CaptureError: before anything is written, for a value SAELens cannot take (a capture that was not
            packed, rows per sequence, a ``positions=`` or top-k selection), a key the capture lacks, a capture
            with no shard yet, or an ``out`` that is not empty.
    """
    from datasets import concatenate_datasets, load_from_disk

    if not isinstance(activations, Activations):
        activations = Activations(activations)
    context, dtype, d_in = _check(activations, key)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CaptureError(f"{out} is not an empty directory; write the SAELens dataset to a new or empty one")
    features = _features(key, context, d_in, dtype)
    parts = out / PARTS
    try:
        parts.mkdir(parents=True, exist_ok=True)
        for index in range(len(activations.shards)):
            _part(activations, index, key, context, d_in, dtype, features).save_to_disk(
                os.fspath(parts / f"shard_{index:05d}"), num_shards=1
            )
        joined = concatenate_datasets(
            [load_from_disk(os.fspath(parts / f"shard_{index:05d}")) for index in range(len(activations.shards))]
        )
        joined.save_to_disk(os.fspath(out))
        del joined
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    return os.fspath(out)


def store_kwargs(path: str | os.PathLike, **overrides: Any) -> dict[str, Any]:
    """The keyword arguments of a SAELens ``ActivationsStore`` reading the dataset ``to_saelens`` wrote at ``path``.

    The dataset fixes ``hook_name``, ``context_size`` and ``d_in``; there is no
    model and no text dataset. ``overrides`` replace any of them; the others
    default to: ``dtype="float32"`` (what the store hands the SAE, which must
    match the SAE's), ``device`` the CPU, ``train_batch_size_tokens=4096``,
    ``store_batch_size_prompts`` (sequences read at a time) 32 or the
    dataset's length if smaller, ``n_batches_in_buffer`` so that SAELens's
    mixing buffer (``n_batches_in_buffer * context_size`` tokens in 6.54) holds
    at least two training batches, and ``total_training_tokens`` every token once.
    """
    from datasets import load_from_disk

    dataset = load_from_disk(os.fspath(path))
    hooks = [name for name in dataset.column_names if name != "token_ids"]
    if len(hooks) != 1:
        raise CaptureError(
            f"{path} holds columns {dataset.column_names}, not one value and token_ids as to_saelens writes"
        )
    context, d_in = dataset.features[hooks[0]].shape
    train_batch = overrides.get("train_batch_size_tokens", 4096)
    kwargs = {
        "model": None,
        "dataset": None,
        "streaming": False,
        "cached_activations_path": os.fspath(path),
        "hook_name": hooks[0],
        "hook_head_index": None,
        "context_size": context,
        "d_in": d_in,
        "dtype": "float32",
        "device": torch.device("cpu"),
        "prepend_bos": False,
        "normalize_activations": "none",
        "train_batch_size_tokens": train_batch,
        "store_batch_size_prompts": min(32, len(dataset)),
        "n_batches_in_buffer": max(20, math.ceil(2 * train_batch / context)),
        "total_training_tokens": len(dataset) * context,
    }
    return {**kwargs, **overrides}


def _check(activations: Activations, key: str) -> tuple[int, str, int]:
    """The capture's context, the dtype to write and ``d_in``, or a ``CaptureError`` saying why SAELens cannot take it."""
    activations._check_key(key)
    value, settings = activations.values[key], activations.manifest["settings"]
    if not settings["pack"]:
        raise CaptureError(
            f"{activations.directory} was captured with pack=False: its sequences have different lengths, and SAELens "
            "takes sequences of context tokens each; capture again with pack=True (the default)"
        )
    if value["axes"][0] != "token":
        raise CaptureError(
            f"{key} holds one row per sequence ({', '.join(value['axes'])}), and SAELens trains on one row per token; "
            "capture a value with a token axis, without reduce='mean'"
        )
    selection = value.get("selection", {})
    if selection.get("positions", "::") != "::":
        raise CaptureError(
            f"{key} was captured at positions={selection['positions']}, not at every token, and SAELens reads every "
            f"token of each sequence; capture {value['name']} without positions="
        )
    if selection.get("reduce") == "topk":
        raise CaptureError(
            f"{key} holds the top-k entries of each row, whose indices SAELens would not see; "
            "capture the value without reduce='topk'"
        )
    if not activations.shards:
        raise CaptureError(f"{activations.directory} lists no complete shard yet; convert it once one is written")
    dtype = ARROW_DTYPES.get(value["dtype"], value["dtype"])
    return settings["context"], dtype, math.prod(value["row_shape"])


def _features(key: str, context: int, d_in: int, dtype: str) -> Any:
    """The Features SAELens's ``CacheActivationsRunner`` gives its datasets, for one hook named ``key``."""
    from datasets import Array2D, Features, Sequence, Value

    return Features(
        {key: Array2D(shape=(context, d_in), dtype=dtype), "token_ids": Sequence(Value(dtype="int32"), length=context)}
    )


def _part(activations: Activations, index: int, key: str, context: int, d_in: int, dtype: str, features: Any) -> Any:
    """Shard ``index`` as a dataset: its sequences in order, each value row at the token it names."""
    from datasets import Dataset

    tensors = activations.shard(index)
    start, stop = activations.shards[index]["sequences"]
    count = stop - start
    rows = _places(
        tensors[f"{key}#row"][:, 0], tensors[f"{key}#row"][:, 1], start, count, context, f"{key} in shard {index}"
    )
    tokens = _places(
        tensors["tokens#sequence"], tensors["tokens#position"], start, count, context, f"tokens of shard {index}"
    )
    data = torch.empty(count * context, d_in, dtype=getattr(torch, dtype))
    data[rows] = tensors[key].reshape(len(rows), d_in).to(data.dtype)
    ids = torch.empty(count * context, dtype=torch.int32)
    ids[tokens] = tensors["tokens"].to(torch.int32)
    columns = {key: data.view(count, context, d_in).numpy(), "token_ids": ids.view(count, context).numpy()}
    return Dataset.from_dict(columns, features=features)


def _places(
    sequences: torch.Tensor, positions: torch.Tensor, start: int, count: int, context: int, what: str
) -> torch.Tensor:
    """Where each row goes in ``[count * context]``, checking that the rows are every token of the shard once."""
    places = (sequences - start) * context + positions
    inside = bool(((positions >= 0) & (positions < context) & (sequences >= start) & (sequences < start + count)).all())
    if not inside or len(places) != count * context or not bool((torch.bincount(places) == 1).all()):
        raise CaptureError(
            f"{what}: the rows are not every token of sequences {start} to {start + count - 1} of {context} tokens "
            "once each, which a packed capture of every token holds; the capture is damaged, capture again"
        )
    return places
