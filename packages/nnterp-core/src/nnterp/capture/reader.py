"""Reading a capture back: its manifest, its shards, and shuffled batches of a value's rows for training."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load, load_file

from .shards import MANIFEST
from .values import CaptureError


class Activations:
    """A capture's directory: what it holds (``manifest``, ``values``) and its rows, shard by shard or in batches.

    Only the shards the manifest lists are read; ``complete`` says whether the
    capture ran to its end (a capture still running, or killed, lists the
    shards written so far).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        path = self.directory / MANIFEST
        if not path.is_file():
            raise CaptureError(f"{self.directory} holds no capture: it has no {MANIFEST}")
        self.manifest: dict[str, Any] = json.loads(path.read_text())

    @property
    def complete(self) -> bool:
        return self.manifest["complete"]

    @property
    def values(self) -> dict[str, dict[str, Any]]:
        """Each value's key -> its name, stored axes (rows first), dtype, row shape and selection."""
        return self.manifest["values"] or {}

    @property
    def shards(self) -> list[dict[str, Any]]:
        return self.manifest["shards"]

    def __len__(self) -> int:
        """How many sequences the listed shards hold."""
        return self.shards[-1]["sequences"][1] if self.shards else 0

    def shard(self, index: int, verify: bool = False) -> dict[str, torch.Tensor]:
        """Every tensor of shard ``index``; with ``verify``, its bytes are checked against the manifest's hash first."""
        path = self.directory / self.shards[index]["file"]
        if not verify:
            return load_file(path)
        blob = path.read_bytes()
        if hashlib.sha256(blob).hexdigest() != self.shards[index]["sha256"]:
            raise CaptureError(f"{path} does not match the hash {MANIFEST} lists: it changed after it was written")
        return load(blob)

    def rows(self, key: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Shard by shard, the rows of ``key`` and which token (``[sequence, position]``) or sequence each is."""
        self._check_key(key)
        for index in range(len(self.shards)):
            tensors = self.shard(index)
            yield tensors[key], tensors[f"{key}#row"]

    def batches(
        self, key: str, batch_size: int, shuffle: bool = True, seed: int = 0, window: int = 4, drop_last: bool = False
    ) -> ActivationBatches:
        """Batches of ``key``'s rows, ``[batch_size, ...row axes]``: a torch ``IterableDataset`` (see ``ActivationBatches``)."""
        self._check_key(key)
        return ActivationBatches(self, key, batch_size, shuffle, seed, window, drop_last)

    def _check_key(self, key: str) -> None:
        if key not in self.values:
            raise CaptureError(f"this capture holds no value {key!r}; it holds {', '.join(self.values) or 'none'}")


class ActivationBatches(torch.utils.data.IterableDataset):
    """A value's rows in batches, shuffled across shards with a fixed seed, for a training loop or a ``DataLoader``.

    Shuffled, each pass visits the shards in an order drawn from ``seed`` and the
    pass number, ``window`` of them at a time, and draws the rows of those shards
    in a random order: rows of different shards meet in a batch while memory
    holds ``window`` shards. The same seed gives the same batches. Under a
    ``DataLoader`` with workers (``batch_size=None``), each worker reads its own
    shards. ``epoch`` (``set_epoch``) changes the draw from one pass to the next.
    """

    def __init__(
        self, capture: Activations, key: str, batch_size: int, shuffle: bool, seed: int, window: int, drop_last: bool
    ) -> None:
        self.capture, self.key, self.batch_size = capture, key, batch_size
        self.shuffle, self.seed, self.window, self.drop_last = shuffle, seed, window, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        count = len(self.capture.shards)
        order = torch.randperm(count, generator=generator).tolist() if self.shuffle else list(range(count))
        worker = torch.utils.data.get_worker_info()
        if worker is not None:
            order = order[worker.id :: worker.num_workers]
        carry: torch.Tensor | None = None
        for start in range(0, len(order), self.window):
            rows = [self.capture.shard(index)[self.key] for index in order[start : start + self.window]]
            pool = torch.cat(([carry] if carry is not None else []) + rows)
            if self.shuffle:
                pool = pool[torch.randperm(len(pool), generator=generator)]
            whole = len(pool) - len(pool) % self.batch_size
            yield from pool[:whole].split(self.batch_size)
            carry = pool[whole:]
        if carry is not None and len(carry) and not self.drop_last:
            yield carry
