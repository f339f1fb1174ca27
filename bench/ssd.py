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

import harness

import nnterp

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


def main() -> None:
    options = harness.options(__doc__.splitlines()[0], layers=4)
    config = {**CONFIG, "num_hidden_layers": options.layers}
    ids = harness.token_ids(options.lengths, CONFIG["vocab_size"])
    plain, per_token, traced = harness.twins("mamba2", config, copies=3)
    for module in per_token.modules():
        if hasattr(module, "chunk_size"):
            module.chunk_size = 1
    model = harness.standardized(traced)
    mixers = [layer.linear_attn for layer in model.layers]
    read_states = harness.read(model, mixers, ["states"], ids)

    def states(n: int) -> None:
        nnterp.chunk_per_token(model)
        try:
            read_states(n)
        finally:
            nnterp.chunk_per_token(model, enabled=False)

    runs = {
        "plain": harness.forward(plain, ids),
        "values": harness.read(model, mixers, VALUES, ids),
        "chunk1": harness.forward(per_token, ids),
        "states": states,
    }
    harness.table(
        f"Mamba-2, {options.layers} mixers (24 heads x head_dim 64 x state 128, chunk 256), hidden 768",
        harness.medians(runs, options.lengths, options.repeats),
        [("values", "plain"), ("chunk1", "plain"), ("states", "plain"), ("states", "chunk1")],
    )


if __name__ == "__main__":
    main()
