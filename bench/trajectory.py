"""What ``state_trajectory`` costs on a live model, next to the forward and the per-token states it stands in for.

Two mixer blocks (and, on Qwen3.5, the softmax attention block its cache needs) of each recurrent family, with the dimensions of bench/deltanet.py (Qwen3.5-0.8B's
gated DeltaNet: 16 heads x 128 x 128), bench/mamba.py (mamba-130m: 1536 channels x state 16) and
bench/ssd.py (mamba2-130m: 24 heads x head_dim 64 x state 128, chunk 256), random weights, batch 1,
transformers' default kernels. Per family, interleaved so machine noise hits the runs alike:

- plain: the unrouted transformers forward;
- trajectory: an unrouted trace reading ``state_trajectory`` (every position) on both mixers;
- routed: on a routed family, the transformers forward (no trace) of a model loaded after
  ``route_kernels(family, "torch")`` (the token-by-token kernel), reading nothing: the base of ``states``;
- states: what serves every state without it: ``states`` on a model routed with
  ``route_kernels(family, "torch")`` (DeltaNet, Mamba-1), or under ``chunk_per_token`` (Mamba-2),
  at the first length (at 4096 tokens DeltaNet's would hold 8 GiB), and on Mamba-2 once more at
  the last length, where its per-token chunking is quadratic (minutes);
- every64: ``trajectory(positions=slice(None, None, 64))`` on both mixers, at the other lengths.

Then the peak memory at the last length of the plain forward and of a trace reading
``trajectory(positions=[-1])``: each in a fresh process, after a short warm-up run, as the rise of the
process's peak resident set (VmHWM, reset through /proc/self/clear_refs) over its resident set
before the run. torch has no CPU allocator statistics and tracemalloc does not see its tensors.

    python bench/trajectory.py [--lengths 1024 4096] [--repeats 1] [--threads N] [--families deltanet mamba ssd]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import deltanet
import harness
import mamba
import ssd
import torch

from nnterp import REGISTRY, RecurrentMixer, route_kernels
from nnterp.components.per_token import PerToken
from nnterp.testing import blocks_with


@dataclass(frozen=True)
class Family:
    model_type: str
    config: dict
    title: str
    load: dict = field(default_factory=dict)


#: Each family's two mixer blocks, with the dimensions of its own benchmark.
FAMILIES = {
    "deltanet": Family(
        "qwen3_5_text",
        # the model needs one softmax attention block: its cache reports the sequence length
        {**deltanet.CONFIG, "num_hidden_layers": 3, "layer_types": ["linear_attention"] * 2 + ["full_attention"]},
        "gated DeltaNet, 2 mixers (16 heads x 128 x 128), hidden 1024",
        dict(attn_implementation="eager"),
    ),
    "mamba": Family(
        "mamba",
        {**mamba.CONFIG, "num_hidden_layers": 2},
        "Mamba-1, 2 mixers (1536 channels x state 16), hidden 768",
    ),
    "ssd": Family(
        "mamba2",
        {**ssd.CONFIG, "num_hidden_layers": 2},
        "Mamba-2, 2 mixers (24 heads x head_dim 64 x state 128, chunk 256), hidden 768",
    ),
}
#: What a peak-memory run does: the plain forward, or a trace reading the last position's state.
PEAK_RUNS = ("plain", "last")
WARM_UP_TOKENS = 64


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--peak", nargs=3, metavar=("FAMILY", "RUN", "TOKENS"), help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.threads:
        torch.set_num_threads(parsed.threads)
    return parsed


def mixers(model) -> list:
    return [model.layers[i].linear_attn for i in blocks_with(model, "linear_attn")]


def trajectory(model, ids: dict[int, torch.Tensor], positions=None) -> harness.Run:
    """A trace reading the state after ``positions`` (every token when ``None``) on every mixer."""

    def run(n: int) -> None:
        with torch.no_grad(), model.trace(ids[n]):
            for mixer in mixers(model):
                mixer.trajectory(positions=positions).save()

    return run


def strategy(family: Family) -> PerToken:
    """How the family's mixers serve the state after every token: routed, or a per-model switch (``PER_TOKEN``)."""
    envoys = REGISTRY.family(family.model_type).ENVOYS.values()
    return next(envoy.PER_TOKEN for envoy in envoys if isinstance(envoy, type) and issubclass(envoy, RecurrentMixer))


def per_token_states(family: Family, ids: dict[int, torch.Tensor]) -> harness.Run:
    """``states`` on every mixer, the way its kind serves them (``PER_TOKEN``): routed, or with the per-model switch on."""
    (module,) = harness.twins(family.model_type, family.config, copies=1, **family.load)
    model = harness.standardized(module)
    read = harness.read(model, mixers(model), ["states"], ids)
    per_token = strategy(family)
    if per_token.routed:
        return read

    def run(n: int) -> None:
        per_token.enable(model)
        try:
            read(n)
        finally:
            per_token.enable(model, enabled=False)

    return run


def measure(family: Family, lengths: list[int], repeats: int) -> dict[tuple[str, int], float]:
    """The family's runs' medians: plain and trajectory at the first length with states; plain and every64 after."""
    ids = harness.token_ids(lengths, family.config["vocab_size"])
    plain, traced = harness.twins(family.model_type, family.config, **family.load)
    model = harness.standardized(traced)
    first, rest = lengths[:1], lengths[1:]
    times = harness.medians(
        {"plain": harness.forward(plain, ids), "trajectory": trajectory(model, ids)}, first, repeats
    )
    if rest:
        every64 = {"plain": harness.forward(plain, ids), "every64": trajectory(model, ids, slice(None, None, 64))}
        times |= harness.medians(every64, rest, repeats)
    routed = strategy(family).routed
    if routed:
        with warnings.catch_warnings():
            # the unrouted model above was compiled with the default kernels and keeps them, as intended here
            warnings.filterwarnings("ignore", r"route_kernels\(.* already traced")
            route_kernels(model.family, "torch")
    try:
        states = {"states": per_token_states(family, ids)}
        if routed:
            (routed_module,) = harness.twins(family.model_type, family.config, copies=1, **family.load)
            states["routed"] = harness.forward(routed_module, ids)
        times |= harness.medians(states, first, repeats)
        if rest and not routed:
            times |= harness.medians(states, lengths[-1:], 1, warm_up=False)
    finally:
        if routed:
            route_kernels(model.family, "default")
    return times


def peak_rise(name: str, run_name: str, tokens: int) -> float:
    """MiB the process's peak resident set rises by during one run of ``run_name`` at ``tokens`` tokens."""
    family = FAMILIES[name]
    ids = harness.token_ids([WARM_UP_TOKENS, tokens], family.config["vocab_size"])
    (module,) = harness.twins(family.model_type, family.config, copies=1, **family.load)
    run: Callable[[int], None]
    if run_name == "plain":
        run = harness.forward(module, ids)
    else:
        run = trajectory(harness.standardized(module), ids, [-1])
    run(WARM_UP_TOKENS)  # imports, and nnsight compiling the traced forward
    return harness.peak_rise(lambda: run(tokens))


def peak_in_fresh_process(name: str, run_name: str, tokens: int, threads: int | None) -> float:
    command = [sys.executable, __file__, "--peak", name, run_name, str(tokens)]
    if threads:
        command += ["--threads", str(threads)]
    return float(subprocess.run(command, check=True, capture_output=True, text=True).stdout.split()[-1])


def report(name: str, times: dict[tuple[str, int], float], peaks: dict[str, float], last: int) -> None:
    family = FAMILIES[name]
    states = "routed states" if strategy(family).routed else "chunk_per_token states"
    print(f"{family.title}; {torch.get_num_threads()} thread(s), median seconds")
    for n in dict.fromkeys(n for _, n in times):
        plain = times["plain", n]
        cells = [f"plain {plain:7.3f}"]
        for key, label in (("trajectory", "state_trajectory"), ("every64", "positions=::64"), ("states", states)):
            if (key, n) in times:
                cells.append(f"{label} {times[key, n]:7.3f} ({times[key, n] / plain:5.2f}x plain)")
        if ("routed", n) in times:
            routed = times["routed", n]
            cells.append(f"routed forward {routed:7.3f}")
            cells.append(f"{states} / routed forward {times['states', n] / routed:5.2f}x")
        if ("every64", n) in times and ("states", n) in times:
            cells.append(f"positions=::64 {times['states', n] / times['every64', n]:.1f}x faster than {states}")
        print(f"  {n:>5} tokens: " + ";  ".join(cells))
    if peaks:
        print(
            f"  peak memory at {last} tokens (rise of VmHWM, fresh process): plain forward {peaks['plain']:.0f} MiB; "
            f"positions=[-1] trace {peaks['last']:.0f} MiB ({peaks['last'] / peaks['plain']:.2f}x)"
        )


def main() -> None:
    parsed = options()
    if parsed.peak:
        name, run_name, tokens = parsed.peak
        print(f"{peak_rise(name, run_name, int(tokens)):.1f}")
        return
    for name in parsed.families:
        times = measure(FAMILIES[name], parsed.lengths, parsed.repeats)
        last = parsed.lengths[-1]
        peaks = {run: peak_in_fresh_process(name, run, last, parsed.threads) for run in PEAK_RUNS}
        report(name, times, peaks, last)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
