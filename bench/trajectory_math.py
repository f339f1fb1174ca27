"""What the chunked state trajectories cost against the kernels they stand in for, side by side at real mixer dims.

For each recurrence, batch 1, one kernel call (a mixer layer) on random inputs at the scale a
trained model hands them:

- kernel: transformers' pure-torch kernel a plain forward runs: the chunked gated delta rule
  (Qwen3.5-0.8B: 16 heads, key and value dim 128, chunk 64), the Mamba-1 scan (mamba-130m:
  1536 channels, state 16; a token loop itself), the Mamba-2 chunk scan (mamba2-130m: 24 heads,
  head_dim 64, state 128, one group, chunk 256);
- loop: what materializes every state without these functions: the routed token-by-token delta
  rule, the Mamba-1 scan's own loop, the Mamba-2 scan with chunk_size=1 (chunk_per_token);
- states all / ::64 / [-1]: delta_rule_states, selective_scan_states, ssd_states with
  ``positions`` None, ``slice(None, None, 64)``, ``[-1]``.

Each time is the median of ``--repeats`` runs after one warm-up; ``x kernel`` divides by the
kernel's time and ``loop/x`` is how many times faster than the loop. On CUDA the peak memory the
call allocates beyond its inputs (its result included) is printed too. ``err`` is the relative
difference between the last state and the kernel's returned final state. Targets, for the plugin
that adds these to a plain forward: every state at 1024 tokens and every 64th at 4096 cheap next
to the forward, Mamba-2's at least 20x faster than chunk_per_token, and [-1]'s peak memory near
the kernel's.

    python bench/trajectory_math.py [--device cuda] [--lengths 1024 4096] [--repeats 3] [--recurrences mamba-2]

Imports only torch, transformers and the three trajectory modules (by file path, so it runs
where nnterp's packages are not installed).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.models.mamba import modeling_mamba
from transformers.models.mamba2 import modeling_mamba2
from transformers.models.qwen3_5 import modeling_qwen3_5

PACKAGES = Path(__file__).resolve().parents[1] / "packages"
SELECTIONS = {"all": None, "::64": slice(None, None, 64), "[-1]": [-1]}


def load(package: str, module: str):
    """A trajectory module by file path, without its package's ``__init__`` (which needs nnsight)."""
    spec = importlib.util.spec_from_file_location(
        f"{module}_trajectory", PACKAGES / package / "src" / module / "trajectory.py"
    )
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


delta_rule_states = load("nnterp-deltanet", "nnterp_deltanet").delta_rule_states
selective_scan_states = load("nnterp-mamba", "nnterp_mamba").selective_scan_states
ssd_states = load("nnterp-ssd", "nnterp_ssd").ssd_states


def measure(run: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, float | None]:
    """Median seconds over ``repeats`` runs after a warm-up, and on CUDA the peak MiB the call allocates."""

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    run()
    synchronize()
    peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        synchronize()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        run()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), peak


def relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


def gated_deltanet(tokens: int, device: torch.device) -> tuple[dict[str, Callable], Callable]:
    heads, dim = 16, 128
    generator = torch.Generator(device).manual_seed(0)
    query, key, value = (torch.randn(1, tokens, heads, dim, device=device, generator=generator) for _ in range(3))
    g = -F.softplus(torch.randn(1, tokens, heads, device=device, generator=generator) - 1.0)
    beta = torch.sigmoid(torch.randn(1, tokens, heads, device=device, generator=generator))
    arguments = dict(g=g, beta=beta, initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)
    chunked = inspect.unwrap(modeling_qwen3_5.torch_chunk_gated_delta_rule)
    recurrent = inspect.unwrap(modeling_qwen3_5.torch_recurrent_gated_delta_rule)
    runs = {
        "kernel": lambda: chunked(query, key, value, **arguments),
        "loop": lambda: recurrent(query, key, value, **arguments),
    }
    for name, positions in SELECTIONS.items():
        runs[name] = lambda positions=positions: delta_rule_states(query, key, value, g, beta, positions=positions)
    return runs, lambda: relative(runs["[-1]"]()[:, 0], chunked(query, key, value, **arguments)[1])


def mamba(tokens: int, device: torch.device) -> tuple[dict[str, Callable], Callable]:
    channels, state_dim = 1536, 16
    generator = torch.Generator(device).manual_seed(0)
    x, dt, z = (torch.randn(1, channels, tokens, device=device, generator=generator) for _ in range(3))
    B, C = (torch.randn(1, state_dim, tokens, device=device, generator=generator) for _ in range(2))
    A = -torch.arange(1, state_dim + 1, device=device, dtype=torch.float32).expand(channels, state_dim)
    steps = torch.logspace(-3, -1, channels, device=device)
    dt_bias = steps + torch.log(-torch.expm1(-steps))
    D = torch.ones(channels, device=device)
    scan = inspect.unwrap(modeling_mamba.mamba_selective_scan)

    def kernel():
        return scan(x, dt, A, B, C, D=D, z=z, delta_bias=dt_bias, delta_softplus=True, return_last_state=True)

    runs = {"kernel": kernel, "loop": kernel}
    for name, positions in SELECTIONS.items():
        runs[name] = lambda positions=positions: selective_scan_states(
            x, dt, A, B, dt_bias=dt_bias, positions=positions
        )
    return runs, lambda: relative(runs["[-1]"]()[:, 0], kernel()[1])


def mamba2(tokens: int, device: torch.device) -> tuple[dict[str, Callable], Callable]:
    heads, head_dim, state_dim = 24, 64, 128
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(1, tokens, heads, head_dim, device=device, generator=generator)
    dt = torch.randn(1, tokens, heads, device=device, generator=generator)
    B, C = (torch.randn(1, tokens, 1, state_dim, device=device, generator=generator) for _ in range(2))
    A = -torch.linspace(1.0, 16.0, heads, device=device)
    steps = torch.logspace(-3, -1, heads, device=device)
    dt_bias = steps + torch.log(-torch.expm1(-steps))
    D = torch.ones(heads, device=device)
    scan = inspect.unwrap(modeling_mamba2.mamba2_chunk_scan)

    def kernel(chunk_size: int = 256):
        return scan(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, dt_softplus=True, return_final_states=True)

    runs = {"kernel": kernel, "loop": lambda: kernel(chunk_size=1)}
    for name, positions in SELECTIONS.items():
        runs[name] = lambda positions=positions: ssd_states(x, dt, A, B, dt_bias=dt_bias, positions=positions)
    return runs, lambda: relative(runs["[-1]"]()[:, 0], kernel()[1].transpose(-1, -2))


RECURRENCES = {"deltanet": gated_deltanet, "mamba-1": mamba, "mamba-2": mamba2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recurrences", nargs="+", choices=list(RECURRENCES), default=list(RECURRENCES))
    options = parser.parse_args()
    device = torch.device(options.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"{name}; torch {torch.__version__}; float32; batch 1; one mixer call")
    columns = ["kernel", "loop", *SELECTIONS]
    print(f"{'':<16}{'tokens':>7}" + "".join(f"{column:>10}" for column in columns) + f"{'err':>10}")
    for label in options.recurrences:
        build = RECURRENCES[label]
        for tokens in options.lengths:
            runs, error = build(tokens, device)
            measured = {column: measure(runs[column], device, options.repeats) for column in columns}
            kernel_time = measured["kernel"][0]
            loop_time = measured["loop"][0]
            rows = {
                "seconds": [f"{measured[c][0]:.4f}" for c in columns],
                "x kernel": [f"{measured[c][0] / kernel_time:.2f}" for c in columns],
                "loop/x": [f"{loop_time / measured[c][0]:.1f}" for c in columns],
            }
            if device.type == "cuda":
                rows["peak MiB"] = [f"{measured[c][1]:.0f}" for c in columns]
            for row, cells in rows.items():
                last = f"{error():.1e}" if row == "seconds" else ""
                print(
                    f"{label if row == 'seconds' else '':<16}{tokens if row == 'seconds' else '':>7}"
                    + "".join(f"{cell:>10}" for cell in cells)
                    + f"{last:>10}   {row}"
                )
            del runs
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
