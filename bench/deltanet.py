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

import warnings

import harness

from nnterp import route_kernels

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


def mixers(model) -> list:
    return [model.layers[i].linear_attn for i, kind in enumerate(LAYER_TYPES) if kind == "linear_attention"]


def main() -> None:
    options = harness.options(__doc__.splitlines()[0])
    ids = harness.token_ids(options.lengths, CONFIG["vocab_size"])
    plain, traced = harness.twins("qwen3_5_text", CONFIG, attn_implementation="eager")
    model = harness.standardized(traced)
    times = harness.medians(
        {"plain": harness.forward(plain, ids), "values": harness.read(model, mixers(model), VALUES, ids)},
        options.lengths,
        options.repeats,
    )
    with warnings.catch_warnings():
        # The values model was compiled with the chunked kernels and keeps them, as intended here.
        warnings.filterwarnings("ignore", r"route_kernels\(.* already traced")
        route_kernels(model.family, "torch")
    try:
        routed_plain, routed_traced = harness.twins("qwen3_5_text", CONFIG, attn_implementation="eager")
        routed = harness.standardized(routed_traced)
        runs = {
            "routed": harness.forward(routed_plain, ids),
            "states": harness.read(routed, mixers(routed), ["states"], ids),
        }
        times |= harness.medians(runs, options.lengths, options.repeats)
    finally:
        route_kernels(model.family, "default")
    harness.table(
        f"gated DeltaNet, {len(mixers(model))} mixers (16 heads x 128 x 128), hidden 1024; states hold 1 MiB per token per mixer",
        times,
        [("values", "plain"), ("states", "routed")],
    )


if __name__ == "__main__":
    main()
