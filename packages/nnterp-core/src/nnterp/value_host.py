"""ValueHost: what an envoy carrying standard values tells them about itself, with the defaults of a plain module.

An :class:`~nnterp.EProperty` is served on an envoy, its host, and asks the
host a few questions as it reads or writes: is the host there at all, where is
its forward, has a write just changed what it keeps. Every class that declares
standard values is a ``ValueHost`` (``Standard``, ``StandardizedTransformer``);
``EProperty`` refuses any other class when it is declared, so the questions are
never left unanswered by a missing method. The defaults here describe a module
that is always present and whose values keep no order beyond the model's
forward; a recurrent mixer (``CallOrder``, ``CallSite``) and a vision tower
answer for themselves.
"""

from __future__ import annotations

from typing import Any

from .order import FORWARD_ORDER


class ValueHost:
    """The questions a standard value asks the envoy it is served on; override the ones a host answers otherwise."""

    def absent(self) -> str | None:
        """Why none of this envoy's values can be served on this load, or ``None``: checked before any value's own reason.

        A vision tower's envoys say so on a load no image reaches (``Vision.no_images``).
        """
        return None

    def order_hint(self, name: str) -> str:
        """The order this host's forward produces its values in, and the fix, for an out-of-order error about ``name``."""
        return FORWARD_ORDER

    def check_order(self, name: str) -> None:
        """Raise :class:`~nnterp.order.OrderError` now if this host's forward has already passed ``name``'s place.

        Called before a value is read or written, so a request the worker
        would wait on in vain fails at once, naming the value; a host that
        keeps no order of its own accepts every request.
        """

    def record_order(self, name: str, written: bool = False) -> None:
        """Note that ``name`` was served (``written``: assigned), so that later requests can be checked against it."""

    def spans_calls(self, value: Any) -> bool:
        """Whether this host serves ``value`` (one of its EProperty descriptors) across several calls of its forward.

        A recurrent mixer's prompt that keeps states runs its kernel in
        pieces; a value read across them is joined. A plain module calls each
        operation once.
        """
        return False

    def replaced(self, location: str, value: Any) -> None:
        """An assignment to one of this host's values has just put ``value`` at ``location``.

        A host that keeps what it read of the running call (a recurrent mixer
        keeps its kernel call's arguments) updates it here, so that values
        computed later from it see the assignment.
        """
