"""Causal tracing: corrupt a prompt's subject, restore one value at one (layer, position), and see what comes back.

Meng et al. (2022) located factual recall in GPT this way, and Sharma, Atkinson and Bau (2024)
in Mamba: the subject tokens' embeddings get Gaussian noise, which lowers the probability of the
clean answer; putting back the clean value of one block at one position, and nothing else,
recovers part of it, and the recovered part is that value's indirect effect. A restored value
is what the block passes on at that position:

- ``"layer_output"``: the residual stream leaving the block;
- ``"attention_output"``: the block's sequence mixer's contribution (its ``self_attn`` or its
  recurrent ``linear_attn``);
- ``"mlp_output"``: its MLP's contribution;
- ``"state"``: a recurrent mixer's state after the token, written as ``set_state_after`` writes
  it, so the later tokens continue from the clean state; on a block with attention instead,
  the stream, which is what that block carries past the token.

Every (layer, position) is one row of a batch: a trace corrupts every row the same way and
restores each row's own value, so a whole grid costs a few batched forwards. Before the first
subject token every row is the clean prompt: one run of those tokens leaves a cache that each
batch continues from (``continuation``), and a value restored there restores what the corrupted
run already has, so those rows are the corrupted baseline without running.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..availability import Unavailable
from ..components.per_token import ChunkBoundaries
from .blocks import Mixers, block_indices, known, mixers, recurrent_mixers, token_ids, within
from .continuation import (
    Prefix,
    continuation_inputs,
    continue_mixers,
    continues_several_tokens,
    expanded,
    run_in_segments,
    starts_from_zeros,
)

#: What ``causal_trace`` restores, by name (see the module).
RESTORED = ("layer_output", "attention_output", "mlp_output", "state")
#: Meng et al.'s noise: three times the standard deviation of the token embeddings.
NOISE_STDS = 3.0


class CausalTrace(NamedTuple):
    """A causal trace: the answer's probability with each value restored, and its clean and corrupted baselines.

    ``scores[v, l, t]`` is the probability of ``answer`` at the last position
    when value ``values[v]`` of block ``layers[l]`` is restored at position
    ``t`` (its indirect effect is ``scores - corrupted``).
    """

    scores: Tensor
    clean: float
    corrupted: float
    answer: int
    subject: tuple[int, ...]
    values: tuple[str, ...]
    layers: tuple[int, ...]
    #: The noise added to the subject's embeddings, ``[subject tokens, hidden_size]``, the same in every row.
    noise: Tensor

    @property
    def indirect_effect(self) -> Tensor:
        """``scores - corrupted``: how much of the answer's probability each restored value brings back."""
        return self.scores - self.corrupted

    def plot(self, value: str | None = None, tokens: list[str] | None = None, ax: Any = None) -> Any:
        """Draw one value's grid as Meng et al. do, a position per row and a block per column; returns the axes.

        ``value`` defaults to the first traced; ``tokens`` label the rows (the
        subject's marked with ``*``). Needs matplotlib (``pip install
        "nnterp-core[plot]"``).
        """
        import matplotlib.pyplot as plt

        grid = self.scores[self.values.index(value) if value is not None else 0].T
        if ax is None:
            _, ax = plt.subplots(figsize=(1 + 0.3 * grid.shape[1], 1 + 0.3 * grid.shape[0]))
        image = ax.imshow(grid.numpy(), cmap="Purples", vmin=self.corrupted, aspect="auto")
        labels = tokens if tokens is not None else [str(position) for position in range(grid.shape[0])]
        ax.set_yticks(
            range(grid.shape[0]), [f"{label}*" if i in self.subject else label for i, label in enumerate(labels)]
        )
        ax.set_xticks(range(grid.shape[1]), [str(layer) for layer in self.layers])
        ax.set_xlabel("layer")
        ax.set_title(
            f"p(answer) restoring {value or self.values[0]} (clean {self.clean:.3g}, corrupted {self.corrupted:.3g})"
        )
        ax.figure.colorbar(image, ax=ax)
        return ax


def causal_trace(
    model: Any,
    prompt: str | Tensor,
    subject: str | Sequence[int],
    values: Iterable[str] = ("layer_output",),
    noise: float | None = None,
    layers: Iterable[int] | None = None,
    answer: int | None = None,
    seed: int = 0,
    batch_size: int = 16,
) -> CausalTrace:
    """Trace which values carry ``prompt``'s answer: corrupt ``subject``, restore each value at each (layer, position).

    Args:
        subject: the subject's token positions, or its text, found in the prompt.
        values: what to restore, any of ``RESTORED`` (see the module).
        noise: the standard deviation of the Gaussian noise added to the subject's embeddings; by default three
            times the token embeddings' (Meng et al.). The same draw (``seed``) corrupts every row.
        layers: the blocks (default: every block).
        answer: the token whose probability is traced (default: the clean run's most likely next token).

    Raises:
        ValueError: an unknown value, a subject not in the prompt, or positions outside it, before anything runs.
        nnterp.Unavailable: ``"state"`` on a recurrent mixer that cannot write the state after a token (its
            family is not routed), with the fix, before anything runs.
    """
    ids = token_ids(model, prompt)
    seq = ids.shape[1]
    positions = _subject_positions(model, prompt, subject, seq)
    values = known(values, RESTORED, "causal_trace restores")
    chosen = block_indices(model, layers)
    places = {value: [_place(model, layer, value) for layer in chosen] for value in values}
    embeddings = model._module.get_input_embeddings().weight
    scale = NOISE_STDS * embeddings.float().std().item() if noise is None else noise
    draw = torch.randn(len(positions), embeddings.shape[1], generator=torch.Generator().manual_seed(seed)) * scale

    every = mixers(model)
    first = positions[0]
    # a Mamba-1 state write inside a continued call would lose what the cached state adds after it
    shares = first > 0 and continues_several_tokens(every) and not ("state" in values and starts_from_zeros(every))
    segments = run_in_segments(model, ids[:, :first], [], every) if shares else None
    prefix = segments.prefixes[first] if segments is not None else None
    start = 0 if prefix is None else first

    def corrupt() -> None:
        embedded = model.embed_tokens.output
        embedded[:, [position - start for position in positions]] += draw.to(embedded)

    clean_values: dict[tuple[str, int], Tensor] = {}
    probabilities: list[Tensor] = []
    with torch.no_grad(), model.trace() as tracer:
        with tracer.invoke(ids):
            probabilities.append(model.logits[:, -1].float().softmax(-1).save())
        for value in values:
            for layer, (owner, name, _) in zip(chosen, places[value], strict=True):
                with tracer.invoke():  # an invoke each: the values are read in no particular forward order
                    clean_values[value, layer] = _read(owner, name).save()
    clean = probabilities[0][0]
    answer = int(clean.argmax()) if answer is None else answer
    grid = [(index, position) for index in range(len(chosen)) for position in range(start, seq)]
    scores = torch.empty(len(values), len(chosen), seq)
    corrupted: list[Tensor] = []
    run = _Run(model, ids, corrupt, answer, every, prefix)
    for value_index, value in enumerate(values):
        clean_of = [clean_values[value, layer] for layer in chosen]
        for first_row in range(0, len(grid), batch_size):
            batch = grid[first_row : first_row + batch_size]
            restored = run.restored(chosen, places[value], clean_of, batch)
            corrupted.append(restored[0])
            for (index, position), probability in zip(batch, restored[1:], strict=True):
                scores[value_index, index, position] = probability
    # before the first subject token the corrupted run is the clean one: restoring there changes nothing
    scores[..., :start] = corrupted[0]
    return CausalTrace(
        scores, float(clean[answer]), float(corrupted[0]), answer, tuple(positions), values, tuple(chosen), draw
    )


class _Run(NamedTuple):
    """How ``causal_trace`` runs its rows: the whole prompt, or its tokens from ``prefix`` on, continuing its cache."""

    model: Any
    ids: Tensor
    corrupt: Any
    answer: int
    every: list[Mixers]
    prefix: Prefix | None

    def restored(
        self, layers: list[int], places: list[tuple[Any, str, str]], clean_of: list[Tensor], batch: list
    ) -> Tensor:
        """One batched trace: row 0 corrupted, row ``1 + i`` corrupted with the value at ``batch[i]`` (the index in
        ``layers`` of its block, whose value is at ``places``, and a position) restored to ``clean_of``'s; the
        answer's probability in each row."""
        model, prefix = self.model, self.prefix
        rows = len(batch) + 1
        start = 0 if prefix is None else prefix.length
        inputs, fitted = {}, contextlib.nullcontext()
        if prefix is not None:
            inputs = continuation_inputs(model, expanded(prefix.cache, rows), self.every, rows, self.ids.shape[1])
            fitted = ChunkBoundaries.fitted(recurrent_mixers(self.every), self.ids.shape[1] - start)
        read: list[Tensor] = []
        with torch.no_grad(), fitted, model.trace(self.ids[:, start:].expand(rows, -1), **inputs):
            self.corrupt()
            # block by block, in forward order: a continued call is told its entering state before its values move
            for block in self.every:
                if prefix is not None:
                    continue_mixers(prefix, [block], rows)
                index = layers.index(block.layer) if block.layer in layers else None
                restored = [(row + 1, position) for row, (at, position) in enumerate(batch) if at == index]
                if restored:
                    _restore(places[index], clean_of[index], restored, start)
            read.append(model.logits[:, -1].float().softmax(-1)[:, self.answer].save())
        return read[0]


def _restore(place: tuple[Any, str, str], clean: Tensor, restored: list[tuple[int, int]], start: int) -> None:
    """Inside a trace whose call starts at prompt position ``start``: put back ``clean``'s value at each (row,
    position) of ``restored``."""
    owner, name, kind = place
    if kind == "state":
        for position in sorted({position for _, position in restored}):
            rows = [row for row, at in restored if at == position]
            state = owner.state_after(position - start).clone()
            state[rows] = clean[:, position].to(state)
            owner.set_state_after(position - start, state)
        return
    rows, at = zip(*restored, strict=True)
    # assigned, not edited in place: the write is checked against the value's layout and reaches the model
    current = getattr(owner, name).clone()
    current[list(rows), [position - start for position in at]] = clean[0, list(at)].to(current)
    setattr(owner, name, current)


def _place(model: Any, layer: int, value: str) -> tuple[Any, str, str]:
    """Where ``value`` of block ``layer`` is read and written: its envoy, the name served there, and how to restore it."""
    block = model.layers[layer]
    mixer = getattr(block, "linear_attn", None) or getattr(block, "self_attn", None)
    if value == "state":
        recurrent = getattr(block, "linear_attn", None)
        if recurrent is None:
            return block, "layer_output", "stream"
        reason = recurrent.support().get("states")
        if reason is not None:
            raise Unavailable(f"causal_trace restoring the state of layers[{layer}].linear_attn: {reason}")
        return recurrent, "trajectory", "state"
    owner = {"layer_output": block, "attention_output": mixer, "mlp_output": getattr(block, "mlp", None)}[value]
    if owner is None:
        raise ValueError(f"causal_trace: layers[{layer}] has no module serving {value}; leave the block out of layers")
    return owner, value, "stream"


def _read(owner: Any, name: str) -> Tensor:
    """The clean value to restore: a stream ``[1, seq, ...]``, or every state of the call ``[1, seq, ...]``."""
    return owner.trajectory() if name == "trajectory" else getattr(owner, name)


def _subject_positions(model: Any, prompt: str | Tensor, subject: str | Sequence[int], seq: int) -> list[int]:
    """The subject's token positions: as given, or the tokens whose characters overlap ``subject`` in the prompt."""
    if not isinstance(subject, str):
        chosen = sorted({position % seq for position in within(subject, seq, "subject", "tokens of the prompt")})
        if not chosen:
            raise ValueError("causal_trace: the subject has no tokens")
        return chosen
    if not isinstance(prompt, str) or subject not in prompt:
        raise ValueError(f"causal_trace: the subject {subject!r} is not in the prompt; give its token positions")
    start = prompt.index(subject)
    end = start + len(subject)
    offsets = model.tokenizer(prompt, return_offsets_mapping=True)["offset_mapping"]
    return [index for index, (first, last) in enumerate(offsets) if first < end and last > start and last > first]
