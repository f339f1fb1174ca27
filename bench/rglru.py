"""What reading an RG-LRU's per-token states costs, measured side by side with the plain forward.

A random-weight RecurrentGemma with recurrentgemma-2b's block pattern (two recurrent blocks, then
local attention) at a smaller width (hidden size 512, lru_width 512, 8 gate blocks, conv width 4). Runs per prompt
length, interleaved so machine noise hits them alike:

- plain: the transformers forward (whose scan is a Python loop over tokens);
- trajectory: a trace reading ``state_trajectory`` (every position) on every RG-LRU;
- states: a trace reading ``states``, the scan loop's own per-token states;
- values: a trace reading the gates, inputs, outputs and states at the call.

Target: trajectory <= 1.5x plain. Absolute times drift on a shared machine; the ratios are the result.

    python bench/rglru.py [--lengths 1024] [--repeats 3] [--layers 3] [--threads N]
"""

from __future__ import annotations

import harness

CONFIG = dict(
    vocab_size=1024,
    hidden_size=512,
    intermediate_size=1024,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=64,
    lru_width=512,
    conv1d_width=4,
    attention_window_size=2048,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
VALUES = (
    "output_gates",
    "conv_output",
    "input_gates",
    "attention_values",
    "recurrence_gates",
    "decays",
    "state_input",
    "attention_head_outputs",
    "state_output",
    "attention_output",
)


def main() -> None:
    options = harness.options(__doc__.splitlines()[0], layers=3)
    harness.mixer_readings(
        options,
        "recurrent_gemma",
        {**CONFIG, "num_hidden_layers": options.layers, "block_types": ["recurrent", "recurrent", "attention"]},
        {"trajectory": ["state_trajectory"], "states": ["states"], "values": VALUES},
        lambda mixers: f"RecurrentGemma, {len(mixers)} RG-LRU blocks of {options.layers} (lru_width 512), hidden 512",
        mixers=lambda model: [
            layer.linear_attn for layer in model.layers if getattr(layer, "linear_attn", None) is not None
        ],
    )


if __name__ == "__main__":
    main()
