"""When a standard value cannot be served: one the model does not have, or one asked for outside a run."""

from __future__ import annotations

from nnsight.intervention.envoy import Envoy
from nnsight.intervention.interleaver import Mediator

from .order import standard_path


class Unavailable(RuntimeError):
    """A standard value this model does not have, and why.

    Raised on access, before anything runs, so a wrong assumption fails at the
    line that makes it. ``StandardizedTransformer.support`` reports the same
    reasons without raising.
    """


def inside_trace(obj: Envoy, what: str) -> None:
    """Raise a ``ValueError`` saying where ``what`` can be used unless a trace is running."""
    try:
        Mediator.current(what)
    except ValueError:
        raise ValueError(
            f"{what} on {standard_path(obj)} is a value of the running model: read or write it inside "
            f"`with model.trace(...)` or `with model.generate(...)`"
        ) from None
