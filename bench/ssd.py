"""What reading a Mamba-2 mixer's values, and its state after every token, costs, measured side by side.

A random-weight Mamba-2 with mamba2-130m's mixer dimensions (hidden size 768,
24 heads of head_dim 64, state_dim 128, one group, chunk size 256), a few
blocks, on transformers' pure-torch kernels (what runs when mamba_ssm is not
installed). Runs per prompt length, interleaved so machine noise hits them
alike:

- plain: the transformers forward;
- values: a trace reading every StateSpace value on every mixer (chunk size 256);
- chunk1: the transformers forward with every mixer's chunk_size set to 1;
- states: a trace reading ``states`` on every mixer after ``nnterp.chunk_per_token``.

``states/chunk1`` is what the trace adds to the per-token chunking itself;
``chunk1/plain`` is the cost of the chunking, quadratic in the number of
chunks. Absolute times drift on a shared machine; the ratios are the result.

    python bench/ssd.py [--lengths 256 1024] [--repeats 3] [--layers 4] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import nnterp
from nnterp import StandardizedTransformer
from nnterp.testing import local_tokenizer

CONFIG = dict(
    vocab_size=1024,
    hidden_size=768,
    num_heads=24,
    head_dim=64,
    state_size=128,
    n_groups=1,
    expand=2,
    conv_kernel=4,
    chunk_size=256,
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
    "state_output",
    "attention_head_outputs",
    "attention_output",
)
RUNS = ("plain", "values", "chunk1", "states")


def build(layers: int) -> tuple[torch.nn.Module, torch.nn.Module, StandardizedTransformer]:
    """Two raw transformers models (the second run with chunk_size 1) and a StandardizedTransformer over a third, identical copy."""
    models = []
    for _ in range(3):
        torch.manual_seed(0)
        config = AutoConfig.for_model("mamba2", num_hidden_layers=layers, **CONFIG)
        models.append(AutoModelForCausalLM.from_config(config).eval())
    for module in models[1].modules():
        if hasattr(module, "chunk_size"):
            module.chunk_size = 1
    return models[0], models[1], StandardizedTransformer(models[2], tokenizer=local_tokenizer(CONFIG["vocab_size"]))


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

    plain, per_token, model = build(options.layers)
    mixers = [layer.linear_attn for layer in model.layers]
    ids = {
        n: torch.randint(3, CONFIG["vocab_size"], (1, n), generator=torch.Generator().manual_seed(n))
        for n in options.lengths
    }

    def forward(n: int) -> None:
        with torch.no_grad():
            plain(ids[n])

    def forward_per_token(n: int) -> None:
        with torch.no_grad():
            per_token(ids[n])

    def read_values(n: int) -> None:
        with torch.no_grad(), model.trace(ids[n]):
            for mixer in mixers:
                for name in VALUES:
                    value = getattr(mixer, name)
                    if value is not None:  # state_input: a prompt starts from no state
                        value.save()

    def read_states(n: int) -> None:
        nnterp.chunk_per_token(model)
        try:
            with torch.no_grad(), model.trace(ids[n]):
                for mixer in mixers:
                    mixer.states.save()
        finally:
            nnterp.chunk_per_token(model, enabled=False)

    runs = dict(zip(RUNS, (forward, read_values, forward_per_token, read_states), strict=True))
    times: dict[tuple[str, int], list[float]] = {}
    for n in options.lengths:
        read_values(n)  # compiles the mixers' forwards and drills the kernels, outside the timing
        read_states(n)
        for _ in range(options.repeats):
            for name, run in runs.items():
                times.setdefault((name, n), []).append(timed(run, n))

    median = {key: statistics.median(values) for key, values in times.items()}
    print(
        f"Mamba-2, {options.layers} mixers (24 heads x head_dim 64 x state 128, chunk 256), hidden 768, "
        f"{torch.get_num_threads()} threads, median of {options.repeats} (seconds)"
    )
    print(
        f"{'tokens':>7}"
        + "".join(f" {name:>8}" for name in RUNS)
        + f" {'values/plain':>13} {'chunk1/plain':>13} {'states/plain':>13} {'states/chunk1':>14}"
    )
    for n in options.lengths:
        t = {name: median[name, n] for name in RUNS}
        print(
            f"{n:>7}"
            + "".join(f" {t[name]:>8.3f}" for name in RUNS)
            + f" {t['values'] / t['plain']:>12.2f}x {t['chunk1'] / t['plain']:>12.2f}x"
            + f" {t['states'] / t['plain']:>12.2f}x {t['states'] / t['chunk1']:>13.2f}x"
        )


if __name__ == "__main__":
    main()
