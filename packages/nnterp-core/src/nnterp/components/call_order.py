"""The order of one recurrent mixer call's values: what the forward produces when, and refusing what it has passed.

Inside one call of a recurrent mixer the forward produces its values in a fixed
order: the kernel call's arguments together, then the state after every token,
then the head outputs and the final state, then the mixer's output. nnsight
serves a value only while the forward has not passed it; a request for one it
has passed would wait for a place that never comes, ending the trace early
with later saves missing. :class:`CallOrder` records how far each call has
come as its values are read and written, and refuses, before the worker waits,
a value the forward has already passed, naming it, the order and the fix.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any, NamedTuple

from nnsight.intervention.interleaver import Mediator

from ..order import OrderError, standard_path
from .per_call import current_call, pinned, records_for, replace_per_call

#: The values read at a kernel call's arguments: the forward produces them together, as the call starts.
CALL_ARGUMENTS = ("state_input", "attention_queries", "attention_keys", "attention_values", "decays", "betas")
#: A call's order where the kernel returns its head outputs and its final state together.
RETURNED_TOGETHER = (CALL_ARGUMENTS, ("state", "states"), ("attention_head_outputs", "state_output"))

#: The order of a recurrent mixer's values that works on every family, on prompts and decode steps alike: the one
#: the docs teach.
TAUGHT_ORDER = (
    *CALL_ARGUMENTS,
    "states",
    "attention_head_outputs",
    "state_output",
    "state_trajectory",
    "attention_output",
)

#: Values a mixer serves from the call's recorded arguments once the forward has passed their place.
RECOMPUTED = ("states", "state_trajectory")


class Reached(NamedTuple):
    """How far one call's forward has come, as its values were read or written."""

    stage: float  #: the furthest stage of the call's order reached
    last: str  #: the value read or written there last
    names: frozenset[str]  #: every value read or written at that stage


class CallOrder:
    """The order of a recurrent mixer call's values, mixed into ``RecurrentMixer``: ``check_order`` / ``record_order``.

    The host serves ``decoding()`` and ``call_arguments()``; ``ORDER`` (and
    ``DECODE_ORDER``) say the order, a group of values at one place.
    """

    #: The values inside one call in the order its forward produces them on a prompt, a group at one place (any
    #: order within it); ``attention_output``, the mixer's output, comes after all of them. ``states`` stands for
    #: ``state_after`` and ``set_state_after`` too.
    ORDER: tuple[tuple[str, ...], ...] = (
        CALL_ARGUMENTS,
        ("state", "states"),
        ("attention_head_outputs",),
        ("state_output",),
    )
    #: The order on a decode step, where it differs from ``ORDER``.
    DECODE_ORDER: tuple[tuple[str, ...], ...] | None = None
    #: What ``ORDER`` says in words, for the errors.
    KIND: str = "recurrent mixer"

    def order(self) -> tuple[tuple[str, ...], ...]:
        """This call's values in the order its forward produces them (``ORDER``, or ``DECODE_ORDER`` on a decode step)."""
        cls = type(self)
        return cls.DECODE_ORDER if cls.DECODE_ORDER is not None and self.decoding() else cls.ORDER

    def order_hint(self, name: str) -> str:
        """The forward's order of this mixer's values and the fix, for an error about ``name``."""
        groups = " -> ".join("/".join(group) for group in (*type(self).ORDER, ("attention_output",)))
        decode = type(self).DECODE_ORDER
        on_decode = "" if decode is None else f" (on a decode step: {' -> '.join('/'.join(g) for g in decode)} -> ...)"
        return (
            f"a {type(self).KIND} call produces its values in this order: {groups}{on_decode}. Read and write one "
            f"call's values in that order (state_input, states, attention_head_outputs, state_output, "
            f"attention_output works on every recurrent mixer), or read {name} in a trace of its own; "
            f"trajectory() and state_trajectory can be read at any point of the call once any of its values was"
        )

    def _stage(self, name: str) -> float | None:
        """Where ``name`` comes in this call's order; the mixer's output after all of it, whichever kernel fires."""
        if name == "attention_output":
            return math.inf
        return next((index for index, group in enumerate(self.order()) if name in group), None)

    def _peek(self, key: str, call: int | None = None) -> Any:
        """What ``per_call(self, key, ...)`` holds for the current call (or ``call``) without computing it; else ``None``."""
        records, current = records_for(self, key)
        record = records.get((self.path, key))
        return record[1] if record is not None and record[0] == (current if call is None else call) else None

    def _between_calls(self) -> bool:
        """Whether the worker follows the model (relaxed) and this mixer has already returned its call of the running forward.

        Then a request is for the next forward's call (the next step of
        ``generate``), though the value was meant for the call just returned.
        """
        mediator = Mediator.current("call")
        forwards = mediator.occurrence(f"{self.root.path}.input")
        return mediator.iteration is None and forwards > 0 and mediator.occurrence(f"{self.path}.output") == forwards

    def _returned(self) -> bool:
        """Whether the call the worker's next request is for has already returned."""
        return Mediator.current("call").occurrence(f"{self.path}.output") > current_call(self)

    def _call_of_the_output(self) -> int:
        """The call ``attention_output`` was read for: read after the mixer returned (at a block's scaling), that call."""
        return current_call(self) - 1 if self._between_calls() else current_call(self)

    def check_order(self, name: str) -> None:
        """Raise :class:`OrderError` when this call's forward has already passed ``name``'s place.

        Two facts say so before the worker would wait in vain: this call of
        the mixer has returned (for a value inside it), or a value the forward
        produces later in the call has been read or written.
        """
        if self._peek("records") is not None:
            return  # a call of several kernel calls serves its values from what it recorded, in any order
        with pinned(None) if name == "state" else nullcontext():
            where = f"{name} on {standard_path(self)}"
            call = current_call(self)
            # computed from the call's recorded arguments once its place has passed
            recomputable = name in RECOMPUTED and self._peek("arguments") is not None
            returned = self._returned()
            if returned and name != "attention_output" and not recomputable:
                raise OrderError(
                    f"{where} was asked for after this call of the mixer returned; {self.order_hint(name)}"
                )
            furthest = self._peek("furthest")
            if furthest is None and self._between_calls():
                # relaxed between calls, a request is for the next call; but a value of the call that just returned,
                # read after a later one in the same loop body, means that call
                furthest = self._peek("furthest", call - 1)
            if furthest is not None and not recomputable:
                # with no arguments recorded, a recomputed value needs the call's start; after the output (whose
                # stage is known before the kernel is), everything inside the call is earlier
                if name in RECOMPUTED or (furthest.stage == math.inf and name != "attention_output"):
                    stage = 0
                else:
                    stage = self._stage(name)
                if stage is not None and stage < furthest.stage:
                    raise OrderError(
                        f"{where} was asked for after {furthest.last}, which this call's forward produces later; "
                        f"{self.order_hint(name)}"
                    )
            if name != "attention_output" and not returned:
                # recorded at the call's start, for what is later computed from them (trajectory, states)
                self.call_arguments()

    def record_order(self, name: str, written: bool = False) -> None:
        """Note that ``name`` was served or written in this call: the place the forward has reached, and state writes."""
        with pinned(None) if name == "state" else nullcontext():
            if written and name in ("state", "states"):
                replace_per_call(self, "state written", True)
            call = self._call_of_the_output() if name == "attention_output" else current_call(self)
            # before anything inside the call is read, which kernel fires is not known: only the output has a stage then
            known = self._peek("kernel", call) is not None or name == "attention_output"
            stage = self._stage(name) if known else None
            furthest = self._peek("furthest", call) or Reached(-1, "", frozenset())
            if stage is not None and stage >= furthest.stage:
                names = furthest.names if stage == furthest.stage else frozenset()
                replace_per_call(self, "furthest", Reached(stage, name, names | {name}), call)
