"""A capture's directory: safetensors shards written in the background, and the manifest that lists the complete ones.

A shard holds whole sequences, and in it each value's rows under the value's
key, ``key#row`` saying which token or sequence each row is (``[sequence,
position]`` per token row, the sequence per sequence row) and, for a top-k,
``key#indices``. ``tokens``, ``tokens#sequence`` and ``tokens#position`` list
every token of its sequences.

A shard is written to a temporary file, synced and renamed, and only then
listed in ``manifest.json``, itself replaced whole: a shard the manifest lists
is complete, and nothing else in the directory counts. A run killed at any
point, started again with the same arguments, removes what is not listed and
goes on from the first sequence after the last listed shard. The manifest holds
no time or host, so the files of a resumed run are byte for byte those of an
uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from .values import CaptureError

MANIFEST = "manifest.json"
FORMAT = "nnterp-capture/1"
#: Shards a writer may hold beside the one being filled: compute and disk overlap, and memory stays bounded.
QUEUED = 1


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


class Store:
    """The directory of one capture: its manifest, and a background writer of its shards."""

    def __init__(self, directory: str | os.PathLike, settings: dict[str, Any]) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / ".nnterp-write-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as error:
            raise CaptureError(
                f"cannot write the capture to {self.directory}: {error.strerror or error}; choose a directory you can write"
            ) from None
        path = self.directory / MANIFEST
        if path.exists():
            self.manifest = json.loads(path.read_text())
            _check_same(self.manifest, settings, self.directory)
        else:
            self.manifest = {"format": FORMAT, "settings": settings, "complete": False, "values": None, "shards": []}
            self._save_manifest()
        self._remove_unlisted()
        self._next_index = len(self.shards)
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUED)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_loop, name="nnterp-capture-writer", daemon=True)
        self._thread.start()

    @property
    def shards(self) -> list[dict[str, Any]]:
        return self.manifest["shards"]

    @property
    def next_sequence(self) -> int:
        """The first sequence no complete shard holds: where a resumed run starts."""
        return self.shards[-1]["sequences"][1] if self.shards else 0

    def write(self, tensors: dict[str, torch.Tensor], sequences: tuple[int, int], values: dict[str, Any]) -> None:
        """Queue a shard of ``sequences`` (start, stop); blocks while the writer is a shard behind."""
        self.raise_failure()
        if self.manifest["values"] is None:
            self.manifest["values"] = values
        self._queue.put((self._next_index, tensors, sequences))
        self._next_index += 1
        self.raise_failure()

    def finish(self) -> None:
        """Wait for every queued shard, then mark the capture complete."""
        self.abandon()
        self.raise_failure()
        self.manifest["complete"] = True
        self._save_manifest()

    def abandon(self) -> None:
        """Stop the writer after what it has queued, leaving the complete shards listed (a failed or interrupted run)."""
        self._queue.put(None)
        self._thread.join()

    def raise_failure(self) -> None:
        if self._error is not None:
            error, done = self._error, len(self.shards)
            raise CaptureError(
                f"could not write shard {done} to {self.directory}: {getattr(error, 'strerror', None) or error}. "
                f"Shards 0 to {done - 1} are complete and listed in {MANIFEST}; free the space (or fix the "
                "directory) and run the same capture again to go on from there"
                if done
                else f"could not write the first shard to {self.directory}: {getattr(error, 'strerror', None) or error}"
            ) from error

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is not None:
                continue
            index, tensors, (start, stop) = item
            try:
                self._write(index, tensors, start, stop)
            except BaseException as error:  # handed to the main thread at its next call
                self._error = error

    def _write(self, index: int, tensors: dict[str, torch.Tensor], start: int, stop: int) -> None:
        blob = save(tensors, metadata={"format": FORMAT})
        name = shard_name(index)
        temporary = self.directory / f"{name}.partial"
        try:
            with open(temporary, "wb") as file:
                file.write(blob)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.directory / name)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        tokens = int(tensors["tokens"].numel())
        entry = {"file": name, "sequences": [start, stop], "tokens": tokens, "sha256": hashlib.sha256(blob).hexdigest()}
        self.shards.append(entry)
        self._save_manifest()

    def _save_manifest(self) -> None:
        temporary = self.directory / f"{MANIFEST}.partial"
        temporary.write_text(json.dumps(self.manifest, indent=1, sort_keys=True) + "\n")
        os.replace(temporary, self.directory / MANIFEST)

    def _remove_unlisted(self) -> None:
        listed = {shard["file"] for shard in self.shards} | {MANIFEST}
        for path in self.directory.iterdir():
            if path.name not in listed and (path.name.startswith("shard-") or path.name.endswith(".partial")):
                path.unlink()


def _check_same(manifest: dict[str, Any], settings: dict[str, Any], directory: Path) -> None:
    if manifest.get("format") != FORMAT:
        raise CaptureError(f"{directory} holds a {MANIFEST} that is not a capture's; choose an empty directory")
    before = manifest["settings"]
    differ = sorted(key for key in before.keys() | settings.keys() if before.get(key) != settings.get(key))
    if differ:
        raise CaptureError(
            f"{directory} holds a capture made with other settings ({', '.join(differ)} differ); "
            "run with the same arguments to resume it, or choose another directory"
        )
