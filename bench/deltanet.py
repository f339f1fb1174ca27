"""What reading a gated DeltaNet's values and its per-token states costs, measured side by side.

A random-weight Qwen3.5 with Qwen3.5-0.8B's mixer dimensions (16 heads, key and
value dim 128, hidden size 1024), a few blocks. Four runs per prompt length,
interleaved so machine noise hits them alike:

- plain: the transformers forward, default (chunked) kernels;
- values: a trace reading every LinearAttention value on every mixer;
- routed: the forward after ``route_kernels(family, "torch")`` (token-by-token kernel);
- states: a routed trace reading ``states`` on every mixer.

Targets: values <= 1.10x plain, states <= 1.25x routed. Absolute times drift on
a shared machine; the ratios are the result. ``states`` materializes 1 MiB per
token per mixer (a [1, 1024, 16, 128, 128] float32 tensor is 1 GiB), and on a
CPU first-touching that much fresh memory is most of its cost over the routed
forward; reading the state at every token (the handoffs and the instrumented
kernel) adds about a tenth.

    python bench/deltanet.py [--lengths 256 1024] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from nnterp import StandardizedTransformer, route_kernels
from nnterp.testing import local_tokenizer

LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
CONFIG = dict(
    vocab_size=1024,
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
VALUES = (
    "attention_queries",
    "attention_keys",
    "attention_values",
    "decays",
    "betas",
    "state_input",
    "attention_head_outputs",
    "state_output",
    "attention_output",
)


def build() -> tuple[torch.nn.Module, StandardizedTransformer]:
    """The raw transformers model and a StandardizedTransformer over an identical copy."""
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        config = AutoConfig.for_model("qwen3_5_text", **CONFIG)
        models.append(AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval())
    return models[0], StandardizedTransformer(models[1], tokenizer=local_tokenizer(CONFIG["vocab_size"]))


def mixers(model: StandardizedTransformer) -> list:
    return [model.layers[i].linear_attn for i, kind in enumerate(LAYER_TYPES) if kind == "linear_attention"]


def timed(run: Callable[[int], None], n: int) -> float:
    start = time.perf_counter()
    run(n)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    options = parser.parse_args()
    if options.threads:
        torch.set_num_threads(options.threads)

    plain, model = build()
    family = model.family
    ids = {
        n: torch.randint(3, CONFIG["vocab_size"], (1, n), generator=torch.Generator().manual_seed(n))
        for n in options.lengths
    }

    def forward(n: int) -> None:
        with torch.no_grad():
            plain(ids[n])

    def read_values(n: int) -> None:
        with torch.no_grad(), model.trace(ids[n]):
            for mixer in mixers(model):
                for name in VALUES:
                    value = getattr(mixer, name)
                    if value is not None:
                        value.save()

    times: dict[tuple[str, int], list[float]] = {}
    for n in options.lengths:
        read_values(n)  # compiles the mixers' forwards, outside the timing
        for _ in range(options.repeats):
            times.setdefault(("plain", n), []).append(timed(forward, n))
            times.setdefault(("values", n), []).append(timed(read_values, n))

    with warnings.catch_warnings():
        # The values model was compiled with the chunked kernels and keeps them, as intended here.
        warnings.filterwarnings("ignore", "route_kernels: .* already traced")
        route_kernels(family, "torch")
    try:
        routed_plain, routed = build()

        def routed_forward(n: int) -> None:
            with torch.no_grad():
                routed_plain(ids[n])

        def read_states(n: int) -> None:
            with torch.no_grad(), routed.trace(ids[n]):
                for mixer in mixers(routed):
                    mixer.states.save()

        for n in options.lengths:
            read_states(n)
            for _ in range(options.repeats):
                times.setdefault(("routed", n), []).append(timed(routed_forward, n))
                times.setdefault(("states", n), []).append(timed(read_states, n))
    finally:
        route_kernels(family, "default")

    median = {key: statistics.median(values) for key, values in times.items()}
    print(
        f"gated DeltaNet, {len(mixers(model))} mixers (16 heads x 128 x 128), hidden 1024, {torch.get_num_threads()} "
        f"thread(s), median of {options.repeats} (seconds); states hold 1 MiB per token per mixer"
    )
    print(
        f"{'tokens':>7} {'plain':>8} {'values':>8} {'values/plain':>13} {'routed':>8} {'states':>8} {'states/routed':>14}"
    )
    for n in options.lengths:
        print(
            f"{n:>7} {median['plain', n]:>8.3f} {median['values', n]:>8.3f} {median['values', n] / median['plain', n]:>12.2f}x"
            f" {median['routed', n]:>8.3f} {median['states', n]:>8.3f} {median['states', n] / median['routed', n]:>13.2f}x"
        )


if __name__ == "__main__":
    main()
