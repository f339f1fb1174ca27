"""What the model benchmarks share: their options, identical random-weight models, and the ratio table.

Every run of a benchmark is timed in turn, length by length and repeat by repeat,
so the noise of a shared machine falls on all of them alike; the medians' ratios
are the result.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from nnterp import StandardizedTransformer, route_kernels
from nnterp.testing import local_tokenizer

#: One timed run: it takes the prompt length.
Run = Callable[[int], None]


def options(description: str, layers: int | None = None) -> argparse.Namespace:
    """Parse ``--lengths``, ``--repeats``, ``--threads`` (and ``--layers`` when a default is given)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    if layers is not None:
        parser.add_argument("--layers", type=int, default=layers)
    parsed = parser.parse_args()
    if parsed.threads:
        torch.set_num_threads(parsed.threads)
    return parsed


def twins(model_type: str, config: dict, copies: int = 2, **load: object) -> list[torch.nn.Module]:
    """``copies`` identical random-weight models of ``model_type``, in eval mode."""
    models = []
    for _ in range(copies):
        torch.manual_seed(0)
        models.append(AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config), **load).eval())
    return models


def standardized(module: torch.nn.Module) -> StandardizedTransformer:
    """A StandardizedTransformer over ``module``, with a local tokenizer of its vocabulary."""
    return StandardizedTransformer(module, tokenizer=local_tokenizer(module.config.vocab_size))


def token_ids(lengths: Iterable[int], vocab_size: int) -> dict[int, torch.Tensor]:
    """A random prompt of each length, the same on every run."""
    return {n: torch.randint(3, vocab_size, (1, n), generator=torch.Generator().manual_seed(n)) for n in lengths}


def forward(module: torch.nn.Module, ids: dict[int, torch.Tensor]) -> Run:
    """The plain transformers forward."""

    def run(n: int) -> None:
        with torch.no_grad():
            module(ids[n])

    return run


def read(model: StandardizedTransformer, mixers: list, values: Iterable[str], ids: dict[int, torch.Tensor]) -> Run:
    """A trace reading ``values`` on every mixer (a value that is ``None``, a prompt's state_input, is skipped)."""
    values = tuple(values)

    def run(n: int) -> None:
        with torch.no_grad(), model.trace(ids[n]):
            for mixer in mixers:
                for name in values:
                    value = getattr(mixer, name)
                    if value is not None:
                        value.save()

    return run


def mixer_readings(
    options: argparse.Namespace,
    model_type: str,
    config: dict,
    readings: dict[str, Iterable[str]],
    title: Callable[[list], str],
    mixers: Callable[[StandardizedTransformer], list] = lambda model: [layer.linear_attn for layer in model.layers],
    routed: ModuleType | None = None,
    **load: object,
) -> None:
    """Time the plain forward against a trace per reading (its label, the values it reads on every mixer), side by
    side, and print each reading's ratio to the plain forward under ``title(mixers)``.

    With ``routed``, that family's kernels are routed to the token loop for the runs (before the first trace:
    nnsight compiles the mixers over these bindings), and back after.
    """
    ids = token_ids(options.lengths, config["vocab_size"])
    routing = contextlib.ExitStack()
    if routed is not None:
        route_kernels(routed, "torch")
        routing.callback(route_kernels, routed, "default")
    with routing:
        plain, traced = twins(model_type, config, **load)
        model = standardized(traced)
        chosen = mixers(model)
        runs = {
            "plain": forward(plain, ids),
            **{label: read(model, chosen, values, ids) for label, values in readings.items()},
        }
        times = medians(runs, options.lengths, options.repeats)
    table(title(chosen), times, [(label, "plain") for label in readings])


def medians(
    runs: dict[str, Run], lengths: Iterable[int], repeats: int, warm_up: bool = True
) -> dict[tuple[str, int], float]:
    """Each run's median time per length; every run goes once untimed first (compiling the traced forwards)
    unless ``warm_up`` is false because it already ran at another length."""
    times: dict[tuple[str, int], list[float]] = {}
    for n in lengths:
        for run in runs.values() if warm_up else ():
            run(n)
        for _ in range(repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run(n)
                times.setdefault((name, n), []).append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


def peak_rise(run: Callable[[], object]) -> float:
    """MiB the process's peak resident set rises by during ``run()``, over its resident set before it.

    torch has no CPU allocator statistics and tracemalloc does not see its tensors, so this reads
    the kernel's VmHWM, reset to the current resident set through /proc/self/clear_refs.
    """
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    run()
    return (_status_kib("VmHWM") - before) / 1024


def resident_peak() -> float:
    """MiB of the process's peak resident set (VmHWM) so far: the model, torch and everything a run added."""
    return _status_kib("VmHWM") / 1024


def _status_kib(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field_name}")


def table(title: str, times: dict[tuple[str, int], float], ratios: Iterable[tuple[str, str]]) -> None:
    """Print the medians and the ratios ``a/b``, a row per prompt length."""
    names = list(dict.fromkeys(name for name, _ in times))
    lengths = list(dict.fromkeys(n for _, n in times))
    ratios = list(ratios)
    print(f"{title}, {torch.get_num_threads()} thread(s), median (seconds)")
    header = f"{'tokens':>7}" + "".join(f" {name:>8}" for name in names)
    print(header + "".join(f" {f'{a}/{b}':>14}" for a, b in ratios))
    for n in lengths:
        row = f"{n:>7}" + "".join(f" {times[name, n]:>8.3f}" for name in names)
        print(row + "".join(f" {times[a, n] / times[b, n]:>13.2f}x" for a, b in ratios))
