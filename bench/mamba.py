"""What reading a Mamba-1 mixer's values and its per-token states costs, measured side by side.

A random-weight Mamba with mamba-130m's mixer dimensions (hidden size 768, 1536
channels, state_dim 16, dt rank 48), a few blocks, its kernels routed to
transformers' pure-torch ones (the scan is the token loop either way when
mamba_ssm is not installed). Three runs per prompt length, interleaved so
machine noise hits them alike:

- plain: the transformers forward;
- values: a trace reading every SelectiveScan value on every mixer;
- states: a trace reading ``states`` on every mixer.

Targets: values <= 1.10x plain, states <= 1.25x plain. Absolute times drift on
a shared machine; the ratios are the result.

    python bench/mamba.py [--lengths 256 1024] [--repeats 3] [--layers 4] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from nnterp import StandardizedTransformer, route_kernels
from nnterp.testing import local_tokenizer

CONFIG = dict(
    vocab_size=1024,
    hidden_size=768,
    state_size=16,
    expand=2,
    conv_kernel=4,
    time_step_rank=48,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
VALUES = (
    "attention_queries",
    "attention_keys",
    "attention_values",
    "betas",
    "decays",
    "state_input",
    "attention_head_outputs",
    "state_output",
    "attention_output",
)


def build(layers: int) -> tuple[torch.nn.Module, StandardizedTransformer]:
    """The raw transformers model and a StandardizedTransformer over an identical copy."""
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        config = AutoConfig.for_model("mamba", num_hidden_layers=layers, **CONFIG)
        models.append(AutoModelForCausalLM.from_config(config).eval())
    return models[0], StandardizedTransformer(models[1], tokenizer=local_tokenizer(CONFIG["vocab_size"]))


def timed(run: Callable[[int], None], tokens: int) -> float:
    start = time.perf_counter()
    run(tokens)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    options = parser.parse_args()
    if options.threads:
        torch.set_num_threads(options.threads)

    from nnterp.families import mamba

    route_kernels(mamba, "torch")  # before the first trace: nnsight compiles the mixers over these bindings
    try:
        plain, model = build(options.layers)
        mixers = [layer.linear_attn for layer in model.layers]
        ids = {
            n: torch.randint(3, CONFIG["vocab_size"], (1, n), generator=torch.Generator().manual_seed(n))
            for n in options.lengths
        }

        def forward(n: int) -> None:
            with torch.no_grad():
                plain(ids[n])

        def read_values(n: int) -> None:
            with torch.no_grad(), model.trace(ids[n]):
                for mixer in mixers:
                    for name in VALUES:
                        value = getattr(mixer, name)
                        if value is not None:  # state_input: a prompt starts from zeros
                            value.save()

        def read_states(n: int) -> None:
            with torch.no_grad(), model.trace(ids[n]):
                for mixer in mixers:
                    mixer.states.save()

        runs = {"plain": forward, "values": read_values, "states": read_states}
        times: dict[tuple[str, int], list[float]] = {}
        for n in options.lengths:
            read_values(n)  # compiles the mixers' forwards and drills the kernels, outside the timing
            read_states(n)
            for _ in range(options.repeats):
                for name, run in runs.items():
                    times.setdefault((name, n), []).append(timed(run, n))
    finally:
        route_kernels(mamba, "default")

    median = {key: statistics.median(values) for key, values in times.items()}
    print(
        f"Mamba-1, {options.layers} mixers (1536 channels x state 16), hidden 768, {torch.get_num_threads()} threads, "
        f"median of {options.repeats} (seconds)"
    )
    print(f"{'tokens':>7} {'plain':>8} {'values':>8} {'states':>8} {'values/plain':>13} {'states/plain':>13}")
    for n in options.lengths:
        print(
            f"{n:>7} {median['plain', n]:>8.3f} {median['values', n]:>8.3f} {median['states', n]:>8.3f}"
            f" {median['values', n] / median['plain', n]:>12.2f}x {median['states', n] / median['plain', n]:>12.2f}x"
        )


if __name__ == "__main__":
    main()
