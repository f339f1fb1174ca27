"""What the exact analyses cost next to the forward they analyse: token mixing and batched knockout.

The models of bench/trajectory.py (two mixer blocks of each recurrent family, with the real
mixer dimensions of bench/deltanet.py, bench/mamba.py and bench/ssd.py), random weights, batch 1,
transformers' default kernels. Interleaved per length, so machine noise hits the runs alike:

- plain: the transformers forward;
- rows64: a trace reading ``token_mixing(positions=slice(-64, None))`` on both mixers, at the
  last length (the target: at most 1.3x plain at 4096 tokens);
- full: a trace reading the whole ``token_mixing()`` on both mixers, at the first length (the
  target: at most 3x plain at 1024 tokens); on Mamba-1 for 64 of its 1536 channels, whose whole
  matrix at 1024 tokens would be 6 GiB per mixer;
- knockout: ``nnterp.analysis.knockout`` of 64 positions of a ``--knockout-length`` prompt,
  ``--batch`` rows per forward (default: knockout's own), against one plain forward of that
  prompt (the naive bound is 64 forwards and the target at most 40x);
- attribution: ``nnterp.analysis.attribution_patch`` of every value the model serves a gradient
  for, at every position of a ``--knockout-length`` prompt, against one plain forward (the target:
  at most 4x), with the recurrent states after every token and without them;
- causal trace: ``nnterp.analysis.causal_trace`` of a 10-token prompt with 3 subject tokens,
  restoring the stream at every layer x position, ``--batch`` rows per forward (default:
  causal_trace's own), against the same trace with each restored row run as its own forward
  (``batch_size=1``; the target: at most 0.6x).

    python bench/analysis.py [--lengths 1024 4096] [--knockout-length 256] [--batch N] [--families deltanet mamba ssd]
                             [--runs full rows64 knockout attribution traced]
"""

from __future__ import annotations

import argparse
import inspect
import sys

import harness
import torch
from trajectory import FAMILIES, mixers

from nnterp import Unavailable
from nnterp.analysis import attribution_patch, causal_trace, knockout
from nnterp.analysis.attribution import ESTIMATED, STATES

KNOCKED = 64
#: What can be timed: the whole token mixing, its last 64 rows, knockout, causal tracing.
RUNS = ("full", "rows64", "knockout", "attribution", "traced")
#: The causal trace's prompt length and subject tokens.
TRACED, SUBJECT = 10, [3, 4, 5]
#: The heads (Mamba-1: channels) the whole matrix is read for.
FULL_HEADS = {"mamba": slice(0, 64)}


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs=2, default=[1024, 4096], metavar=("FULL", "ROWS64"))
    parser.add_argument("--knockout-length", type=int, default=256)
    parser.add_argument("--batch", type=int, help="rows per forward (default: each analysis's own batch_size)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS), help="which analyses to time")
    parsed = parser.parse_args()
    if parsed.threads:
        torch.set_num_threads(parsed.threads)
    return parsed


def rows_per_forward(analysis, parsed: argparse.Namespace) -> int:
    """``--batch``, or else ``analysis``'s own ``batch_size``."""
    return parsed.batch or inspect.signature(analysis).parameters["batch_size"].default


def mixing(model, ids: dict[int, torch.Tensor], positions=None, heads=None) -> harness.Run:
    """A trace reading ``token_mixing(positions=positions, heads=heads)`` on every mixer."""

    def run(n: int) -> None:
        with torch.no_grad(), model.trace(ids[n]):
            for mixer in mixers(model):
                mixer.token_mixing(positions=positions, heads=heads).save()

    return run


def knocking(model, ids: dict[int, torch.Tensor], batch: int) -> harness.Run:
    """``knockout`` of 64 evenly spread positions, ``batch`` rows per forward."""

    def run(n: int) -> None:
        with torch.no_grad():
            knockout(model, ids[n], torch.linspace(0, n - 1, KNOCKED).long().tolist(), batch_size=batch)

    return run


def attributing(model, ids: dict[int, torch.Tensor], states: bool = True) -> harness.Run:
    """``attribution_patch`` of every value the model serves a gradient for (probed on a short prompt), with or
    without the recurrent states, the prompt against itself reversed."""
    probe = ids[TRACED]
    values = []
    for value in ESTIMATED if states else [value for value in ESTIMATED if value != STATES]:
        try:
            attribution_patch(model, probe, probe.flip(1), values=[value])
            values.append(value)
        except Unavailable:
            continue

    def run(n: int) -> None:
        attribution_patch(model, ids[n], ids[n].flip(1), values=values)

    return run


def tracing(model, ids: dict[int, torch.Tensor], batch: int) -> harness.Run:
    """``causal_trace`` of the stream at every layer x position, ``batch`` rows per forward."""

    def run(n: int) -> None:
        causal_trace(model, ids[n], SUBJECT, batch_size=batch)

    return run


def measure(name: str, parsed: argparse.Namespace) -> dict[tuple[str, int], float]:
    family = FAMILIES[name]
    full, rows64 = parsed.lengths
    ids = harness.token_ids([full, rows64, parsed.knockout_length, TRACED], family.config["vocab_size"])
    plain, traced = harness.twins(family.model_type, family.config, **family.load)
    model = harness.standardized(traced)
    forward = harness.forward(plain, ids)
    timed = {
        "full": (mixing(model, ids, heads=FULL_HEADS.get(name)), full),
        "rows64": (mixing(model, ids, slice(-64, None)), rows64),
        "knockout": (knocking(model, ids, rows_per_forward(knockout, parsed)), parsed.knockout_length),
        "attribution": (attributing(model, ids), parsed.knockout_length),
        "traced": (tracing(model, ids, rows_per_forward(causal_trace, parsed)), TRACED),
    }
    times: dict[tuple[str, int], float] = {}
    for run in parsed.runs:
        analysis, length = timed[run]
        others = {
            "traced": {"alone": tracing(model, ids, 1)},
            "attribution": {"streams": attributing(model, ids, states=False)},
        }.get(run, {})
        times |= harness.medians({"plain": forward, **others, run: analysis}, [length], parsed.repeats)
    return times


def report(name: str, times: dict[tuple[str, int], float], parsed: argparse.Namespace) -> None:
    family = FAMILIES[name]
    print(f"{family.title}; {torch.get_num_threads()} thread(s), median seconds")
    for (run, n), seconds in times.items():
        if run in ("plain", "alone", "streams"):
            continue
        if run == "traced":
            alone = times["alone", n]
            print(
                f"  {n:>5} tokens: causal_trace of the stream at every layer x position, "
                f"{rows_per_forward(causal_trace, parsed)} rows per forward "
                f"{seconds:8.3f}; each row its own forward {alone:8.3f} ({seconds / alone:.2f}x, target at most 0.6x)"
            )
            continue
        plain = times["plain", n]
        label = {
            "full": "token_mixing() whole" + (" (64 channels)" if name in FULL_HEADS else ""),
            "rows64": "token_mixing(positions=-64:)",
            "knockout": f"knockout of {KNOCKED} positions, {rows_per_forward(knockout, parsed)} per forward",
            "attribution": "attribution_patch of every value with a gradient",
        }[run]
        print(f"  {n:>5} tokens: plain {plain:7.3f}; {label} {seconds:8.3f} ({seconds / plain:6.2f}x plain)")
        if run == "attribution":
            streams = times["streams", n]
            print(f"  {n:>5} tokens: the same but the states {streams:8.3f} ({streams / plain:6.2f}x plain)")


def main() -> None:
    parsed = options()
    for name in parsed.families:
        report(name, measure(name, parsed), parsed)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
