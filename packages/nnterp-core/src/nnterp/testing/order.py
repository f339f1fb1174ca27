"""TraceOrderSuite: a recurrent mixer's values in any order either do what forward order does, or raise at once.

The trace contract, checked as a matrix: every ordered pair of a mixer's
values (two reads, or a write then a read) in one trace, on a prompt and on
every step of ``generate``. A pair either gives the tensors the same two
operations give in the forward's own order, or raises
:class:`~nnterp.order.OrderError` naming the value asked for and the order.
Never a trace that ends early with a save missing, and never a dropped
write: the forward-order run of a write differs from a run without it.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import torch

from ..components.call_order import RECOMPUTED, TAUGHT_ORDER
from ..order import OrderError
from .suites import PROMPT, Suite

#: Not a mixer's value: the model's logits, read after the mixer's values to see a write reach them.
LOGITS = "logits"
#: Decode steps the generate runs take after the prompt's step: two, so that a read served from the wrong step shows.
DECODE_STEPS = 2
#: How far a value may be from the forward-order run's (states computed from the arguments are not the loop's bits).
TOLERANCE = 1e-5


def _matches(actual: Any, expected: Any) -> bool:
    if expected is None or actual is None:
        return actual is expected
    if actual.shape != expected.shape:
        return False
    scale = expected.float().abs().max().clamp_min(1e-30)
    return bool(((actual.float() - expected.float()).abs().max() / scale) <= TOLERANCE)


class TraceOrderSuite(Suite):
    """Every pair of a recurrent mixer's values, read/read and write/read, on a prompt and on decode steps."""

    #: The values a pair may write (each written as its own value halved).
    WRITABLE: ClassVar[tuple[str, ...]] = (
        "attention_values",
        "attention_head_outputs",
        "state_output",
        "attention_output",
    )

    def order_layer(self) -> int:
        """The block whose mixer the pairs are tried on (the suite it is mixed into says)."""
        raise NotImplementedError

    def per_token_states(self) -> Any:
        """Where the mixer's ``states`` serve every token (the suite it is mixed into says)."""
        raise NotImplementedError

    def served_values(self) -> list[str]:
        """The values of ``TAUGHT_ORDER`` this mixer has where its per-token states are served, by its support."""
        with self.per_token_states():
            support = self.model.layers[self.order_layer()].linear_attn.support()
        return [name for name in TAUGHT_ORDER if name in support and support[name] is None]

    def run_operations(self, operations: list[tuple[str, bool]], decode: bool) -> list[list[Any]]:
        """Each step's results of ``operations`` (value name, whether to write it) on the mixer, in that order.

        A write assigns the value halved and yields nothing; a read yields
        the saved value. A prompt is one trace; ``decode`` runs ``generate``
        and does the operations on each decode step after the prompt's
        (``tracer.iter[1:]``, where a read follows the model once the step's
        first read has pinned it). ``self.head_calls`` counts the forwards
        that reached the output embedding, also when the run raises.
        """
        mixer = self.model.layers[self.order_layer()].linear_attn
        steps: list[list[Any]] = []

        def operate() -> list[Any]:
            results: list[Any] = []
            for name, write in operations:
                if write:
                    setattr(mixer, name, getattr(mixer, name) * 0.5)
                else:
                    value = self.model.logits if name == LOGITS else getattr(mixer, name)
                    results.append(None if value is None else value.save())
            return results

        self.head_calls = 0

        def count(*_: Any) -> None:
            self.head_calls += 1

        hook = self.model._module.get_output_embeddings().register_forward_hook(count)
        try:
            with self.per_token_states():
                if decode:
                    tokens = 1 + DECODE_STEPS
                    with self.model.generate(
                        PROMPT, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
                    ) as tracer:
                        for _ in tracer.iter[1:tokens]:
                            steps.append(operate())
                else:
                    with self.model.trace(PROMPT):
                        steps.append(operate())
        finally:
            hook.remove()
        return steps

    def must_work(self, first: tuple[str, bool], second: tuple[str, bool], decode: bool) -> bool:
        """Whether the contract promises this pair: in the taught order, at one place, or recomputed from the call."""
        rank = {name: index for index, name in enumerate(TAUGHT_ORDER)}
        mixer_class = type(self.model.layers[self.order_layer()].linear_attn)
        order = mixer_class.DECODE_ORDER if decode and mixer_class.DECODE_ORDER is not None else mixer_class.ORDER
        together = any(first[0] in group and second[0] in group for group in (*order, ("attention_output",)))
        # computed from the call's arguments, recorded by any value read inside the call before it
        recomputed = second[0] in RECOMPUTED and first[0] != "attention_output"
        return rank[first[0]] <= rank[second[0]] or together or recomputed

    def check_pairs(self, pairs: list[tuple[tuple[str, bool], tuple[str, bool]]], decode: bool) -> None:
        """Each pair gives what the forward's order gives, or raises OrderError at once naming the value asked for."""
        rank = {name: index for index, name in enumerate(TAUGHT_ORDER)}
        failures: list[str] = []
        for first, second in pairs:
            kind = "decode steps" if decode else "prompt"
            label = f"{'write' if first[1] else 'read'} {first[0]} then read {second[0]} ({kind})"
            try:
                steps = self.run_operations([first, second], decode)
            except OrderError as error:
                if self.must_work(first, second, decode):
                    failures.append(f"{label}: an order the contract promises raised {error}")
                elif second[0] not in str(error) or "in this order" not in str(error):
                    failures.append(f"{label}: the error names neither the value nor the order: {error}")
                # raised at the line that asks, so the forward stopped there: only the prompt's step reached the head
                elif self.head_calls != int(decode):
                    failures.append(f"{label}: raised only after the forward ran on ({self.head_calls} head calls)")
                continue
            if len(steps) != (DECODE_STEPS if decode else 1) or any(len(step) != 2 - first[1] for step in steps):
                failures.append(f"{label}: the trace ended early ({[len(step) for step in steps]} saves per step)")
                continue
            ordered = sorted([first, second], key=lambda operation: rank[operation[0]])
            reference = self.run_operations(ordered, decode) if ordered != [first, second] else steps
            for step, (got, want) in enumerate(zip(steps, reference, strict=True)):
                mine = dict(zip([op for op in (first, second) if not op[1]], got, strict=True))
                theirs = dict(zip([op for op in ordered if not op[1]], want, strict=True))
                for operation, value in mine.items():
                    if not _matches(value, theirs[operation]):
                        failures.append(f"{label}: step {step} {operation[0]} differs from the forward order's")
        assert not failures, "\n".join(failures)

    def read_pairs(self) -> list[tuple[tuple[str, bool], tuple[str, bool]]]:
        values = self.served_values()
        return [((a, False), (b, False)) for a, b in itertools.permutations(values, 2)]

    def write_pairs(self) -> list[tuple[tuple[str, bool], tuple[str, bool]]]:
        values = self.served_values()
        writes = [name for name in self.WRITABLE if name in values]
        return [((w, True), (r, False)) for w in writes for r in values if r != w]

    def test_every_pair_of_reads_on_a_prompt(self) -> None:
        self.check_pairs(self.read_pairs(), decode=False)

    def test_every_pair_of_reads_on_every_generate_step(self) -> None:
        self.check_pairs(self.read_pairs(), decode=True)

    def test_every_write_then_read_on_a_prompt(self) -> None:
        self.check_pairs(self.write_pairs(), decode=False)

    def test_every_write_then_read_on_every_generate_step(self) -> None:
        self.check_pairs(self.write_pairs(), decode=True)

    def test_the_taught_order_on_a_prompt_and_every_step(self) -> None:
        """All values in the taught order, in one trace: every one served on the prompt and on each decode step."""
        values = self.served_values()
        for decode in (False, True):
            steps = self.run_operations([(name, False) for name in values], decode)
            assert len(steps) == (DECODE_STEPS if decode else 1)
            assert all(len(step) == len(values) for step in steps), f"decode={decode}: saves missing"

    def test_two_invokes_of_a_padded_batch_keep_their_own_order(self) -> None:
        """Two invokes, one reading in the taught order and one reversed: each gets its own prompt's values."""
        mixer = self.model.layers[self.order_layer()].linear_attn
        prompts = ("Hello world, there", "Hi you")
        later = "attention_head_outputs"
        earlier = "states" if "states" in self.served_values() else "state_trajectory"
        alone: list[list[torch.Tensor]] = []
        together: list[list[torch.Tensor]] = [[], []]
        with self.per_token_states():
            for prompt in prompts:
                with self.model.trace(prompt):
                    alone.append([getattr(mixer, earlier).save(), getattr(mixer, later).save()])
            with self.model.trace() as tracer:
                with tracer.invoke(prompts[0]):
                    together[0].extend((getattr(mixer, earlier).save(), getattr(mixer, later).save()))
                with tracer.invoke(prompts[1]):
                    heads = getattr(mixer, later).save()
                    together[1].extend((getattr(mixer, earlier).save(), heads))
        for index, (got, want) in enumerate(zip(together, alone, strict=True)):
            assert len(got) == 2, f"invoke {index}: the trace ended early"
            for name, value, expected in zip((earlier, later), got, want, strict=True):
                # the second prompt is shorter: left-padded in the batch, its own tokens are the last ones
                tokens = expected.shape[1]
                assert _matches(value[:, -tokens:], expected), f"invoke {index}: {name} differs from its own trace's"

    def test_each_write_reaches_the_model(self) -> None:
        """A write in forward order changes what follows it (the mixer's later values, the logits): none is dropped."""
        values = self.served_values()
        rank = {name: index for index, name in enumerate(TAUGHT_ORDER)}
        for write in (name for name in self.WRITABLE if name in values):
            reads = [(name, False) for name in values if rank[name] > rank[write]] + [(LOGITS, False)]
            for decode in (False, True):
                if write == "state_output":  # what the cache receives: this call's output is already computed
                    self.check_state_output_reaches_the_next_step(1 if decode else 0)
                    continue
                clean = self.run_operations(reads, decode)
                written = self.run_operations([(write, True), *reads], decode)
                changed = [
                    name
                    for got_step, want_step in zip(written, clean, strict=True)
                    for (name, _), got, want in zip(reads, got_step, want_step, strict=True)
                    if not _matches(got, want)
                ]
                where = "decode" if decode else "prompt"
                assert changed, f"writing {write} ({where}) changed none of {[name for name, _ in reads]}"

    def check_state_output_reaches_the_next_step(self, step: int) -> None:
        """A ``state_output`` written on ``step``, before and after the head outputs, is the next step's ``state_input``."""
        mixer = self.model.layers[self.order_layer()].linear_attn
        orders = [False] + (["attention_head_outputs" in self.served_values()] if step else [])
        for after_head_outputs in orders:
            written: list[torch.Tensor] = []
            entering: list[torch.Tensor] = []
            tokens = step + 2
            with self.per_token_states():
                with self.model.generate(
                    PROMPT, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
                ) as tracer:
                    for current in tracer.iter[:tokens]:
                        if current == step:
                            if after_head_outputs:
                                mixer.attention_head_outputs.save()
                            mixer.state_output = torch.full_like(mixer.state_output, 0.25)
                            written.append(mixer.state_output.save())
                        if current == step + 1:
                            entering.append(mixer.state_input.save())
            where = f"on step {step}" + (" after the head outputs" if after_head_outputs else "")
            assert _matches(entering[0], written[0]), f"a state_output written {where} is not the next step's start"

    def test_wrong_writes_are_refused_at_the_write(self) -> None:
        """A write of another shape, or of integers, raises ValueError naming the value and the expected shape."""
        mixer = self.model.layers[self.order_layer()].linear_attn
        values = self.served_values()
        for name in (name for name in self.WRITABLE if name in values):
            for wrong in ("shape", "kind"):
                saved: list[torch.Tensor] = []
                try:
                    with self.model.trace(PROMPT):
                        served = getattr(mixer, name)
                        if wrong == "shape":
                            setattr(mixer, name, torch.zeros(*served.shape[:-1], served.shape[-1] + 1))
                        else:
                            setattr(mixer, name, torch.zeros(served.shape, dtype=torch.long))
                        saved.append(self.model.logits.save())
                except ValueError as error:
                    assert name in str(error), str(error)
                    expected = "expected a tensor of shape" if wrong == "shape" else "expected floating point"
                    assert expected in str(error), str(error)
                else:
                    raise AssertionError(f"a {name} of the wrong {wrong} was accepted")
                assert not saved, f"the trace went on past the refused {name} write"
