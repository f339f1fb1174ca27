"""The order a forward produces standard values in, and the error for a value asked for out of it.

nnsight serves a value when the forward reaches its place, so the reads and
writes of one trace must follow the forward. A request for a place the forward
has already passed can never be served: nnsight notices only when the run is
over, and inside a ``tracer.iter`` loop it takes such a request for a loop that
outran the generation and ends the trace with a warning, dropping the saves and
writes that follow. Every standard value checks before it waits
(:func:`check_ahead`) and raises :class:`OrderError` at once, naming the value,
the order the forward produces values in, and the fix.
"""

from __future__ import annotations

import re
from typing import Any

from nnsight.intervention.interleaver import Mediator, OutOfOrderError

#: The order of the values of a model's forward, for values that do not say more.
FORWARD_ORDER = (
    "a forward produces the embeddings, then each block in turn (its layer_input, its sublayers' values, "
    "its layer_output), then the final norm and the logits; read and write them in that order, or in separate "
    "traces"
)


class OrderError(OutOfOrderError):
    """A standard value asked for after the forward has produced it, in one trace.

    Raised before the worker waits, at the line that asks, so nothing after it
    is silently skipped. The message names the value, what was read before it
    that the forward produces later, the forward's order and the fix. A
    subclass of nnsight's ``OutOfOrderError``: code catching that catches this.
    """


def standard_path(envoy: Any) -> str:
    """Where an envoy sits under the standard names: ``layers[0].linear_attn`` rather than ``model.backbone.layers.0.mixer``."""
    try:
        node = envoy.root
        rest = envoy.path[len(node.path) + 1 :]
        names: list[str] = []
        while rest:
            for alias, real in sorted(node._aliases.items(), key=lambda item: -len(item[1])):
                if rest == real or rest.startswith(real + "."):
                    head, rest = alias, rest[len(real) + 1 :]
                    break
            else:
                head, _, rest = rest.partition(".")
            names.append(head)
            node = getattr(node, head)
    except (AttributeError, IndexError, TypeError):
        return envoy.path
    return re.sub(r"\.(\d+)", r"[\1]", ".".join(names)) or "model"


def passed(location: str) -> int | None:
    """How many times the forward has reached ``location`` when the worker's request is for a visit it has passed, else ``None``.

    A request asks for the visit its worker is pinned to (``tracer.iter``, or
    0 in a plain trace), or, relaxed (after a pinned step's first read), for
    the next one. The next input of a module that is running now would be its
    next call's: the read meant this call's, which has passed.
    """
    mediator = Mediator.current(location)
    reached = mediator.occurrence(location)
    if mediator.wanted(location) < reached:
        return reached
    if mediator.iteration is None and location.endswith(".input"):
        module = location[: -len(".input")]
        if reached > mediator.occurrence(f"{module}.output"):
            return reached
    return None
