"""Per-call records: what one call of a module computes once, on the worker running the intervention code.

A recurrent mixer's values depend on things its forward decides once per call
(which kernel fires, the kernel call's arguments, the place the worker has
reached); :func:`per_call` keeps them on the worker greenlet, keyed by the call
of the module the worker's next request is for (:func:`current_call`), and
:func:`pinned` pins one read to one occurrence of its place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nnsight.intervention.interleaver import Mediator

#: The worker-greenlet attribute holding per_call's records.
RECORDS = "_nnterp_per_call"


def per_call(envoy: Any, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per call of the envoy's module, under ``key``.

    For something several values of one call depend on and the model serves
    once: the kernel the forward branches to, the call's arguments, its
    sequence length. The current call is the worker's pin when ``tracer.iter``
    pins a non-zero step (a mixer's operations fire once per call, so
    occurrence k is call k), else how many times the module's output has been
    passed, which nnsight counts whether or not anything read it: inside call
    c that is c, and between calls it names the one about to start.

    The records live on the worker greenlet running the intervention code.
    Every run of every invoke has its own worker, so two invokes never share a
    record and none outlives its run.
    """
    records, call = records_for(envoy, key)
    record = records.get((envoy.path, key))
    if record is not None and record[0] == call:
        return record[1]
    value = compute()
    records[(envoy.path, key)] = (call, value)
    return value


def replace_per_call(envoy: Any, key: str, value: Any, call: int | None = None) -> None:
    """Make ``value`` what ``per_call(envoy, key, ...)`` returns for the rest of the current call (or of ``call``)."""
    records, current = records_for(envoy, key)
    records[(envoy.path, key)] = (current if call is None else call, value)


def records_for(envoy: Any, key: str) -> tuple[dict, int]:
    """The worker's per-call records, and the call of ``envoy``'s module they are for now."""
    mediator = Mediator.current(key)
    return mediator.worker.__dict__.setdefault(RECORDS, {}), current_call(envoy)


def current_call(envoy: Any) -> int:
    """The call of ``envoy``'s module the worker's next request is for.

    The call the worker is pinned to (``tracer.iter[k]`` on ``generate``, one
    call per step; 0 in a plain trace), or, relaxed, the call running now or
    about to start: how many times the module's output has been passed.
    """
    mediator = Mediator.current("call")
    if mediator.iteration is not None:
        return mediator.iteration
    return mediator.occurrence(f"{envoy.path}.output")


@contextmanager
def pinned(occurrence: int | None) -> Iterator[None]:
    """Pin this worker's reads to ``occurrence`` of their location, as ``tracer.iter[n]`` does; ``None`` relaxes the pin.

    A pinned non-zero read is served at that occurrence and relaxes the pin, so
    one ``with`` holds one read. The pin the worker had is restored on exit.
    """
    mediator = Mediator.current("pinned")
    previous = mediator.iteration
    mediator.iteration = occurrence
    try:
        yield
    finally:
        mediator.iteration = previous
