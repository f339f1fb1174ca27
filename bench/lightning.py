"""What reading MiniMax's lightning attention values and its state after every token costs, measured side by side.

A random-weight MiniMax of lightning blocks only (hidden size 512, 8 heads of
64, blocks of 256 tokens, 4 experts of 2), a few blocks. Three runs per prompt
length, interleaved so machine noise hits them alike:

- plain: the transformers forward;
- values: a trace reading every LightningAttention value on every mixer;
- trajectory: a trace reading ``state_trajectory`` (the state after every token) on every mixer.

Target: trajectory <= 1.5x plain. Absolute times drift on a shared machine; the ratios are the result.

    python bench/lightning.py [--lengths 256 1024] [--repeats 3] [--layers 2] [--threads N]
"""

from __future__ import annotations

import harness

CONFIG = dict(
    vocab_size=1024,
    hidden_size=512,
    intermediate_size=256,
    num_attention_heads=8,
    num_key_value_heads=8,
    head_dim=64,
    num_local_experts=4,
    num_experts_per_tok=2,
    block_size=256,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
VALUES = (
    "attention_queries",
    "attention_keys",
    "attention_values",
    "decays",
    "attention_head_outputs",
    "output_gates",
    "state_output",
    "attention_output",
)


def main() -> None:
    options = harness.options(__doc__.splitlines()[0], layers=2)
    config = {**CONFIG, "num_hidden_layers": options.layers, "layer_types": ["linear_attention"] * options.layers}
    harness.mixer_readings(
        options,
        "minimax",
        config,
        {"values": VALUES, "trajectory": ["state_trajectory"]},
        lambda mixers: f"MiniMax lightning attention, {len(mixers)} mixers (8 heads x 64), hidden 512",
    )


if __name__ == "__main__":
    main()
