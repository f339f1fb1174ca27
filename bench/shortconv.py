"""What reading a gated short convolution's values and its window after every token costs, measured side by side.

A random-weight LFM2 a bit larger than the tests' tiny one (hidden size 256,
conv width 3), its blocks alternating conv and attention. Three runs per
prompt length, interleaved so machine noise hits them alike:

- plain: the transformers forward;
- values: a trace reading every ShortConv value on every conv block;
- trajectory: a trace reading ``state_trajectory`` (the window after every
  token, [batch, seq, channels, k]) on every conv block.

Target: trajectory <= 1.5x plain. Absolute times drift on a shared machine;
the ratios are the result.

    python bench/shortconv.py [--lengths 1024] [--repeats 3] [--layers 4] [--threads N]
"""

from __future__ import annotations

import harness

CONFIG = dict(
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    conv_L_cache=3,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
VALUES = (
    "state_input",
    "attention_keys",
    "attention_queries",
    "attention_values",
    "conv_input",
    "decays",
    "attention_head_outputs",
    "state_output",
    "attention_output",
)


def main() -> None:
    options = harness.options(__doc__.splitlines()[0], layers=4)
    layer_types = ["conv" if i % 2 == 0 else "full_attention" for i in range(options.layers)]
    harness.mixer_readings(
        options,
        "lfm2",
        {**CONFIG, "num_hidden_layers": options.layers, "layer_types": layer_types},
        {"values": VALUES, "trajectory": ["state_trajectory"]},
        lambda mixers: f"LFM2, {len(mixers)} conv blocks of {len(layer_types)} (256 channels x window 3), hidden 256",
        mixers=lambda model: [model.layers[i].linear_attn for i, kind in enumerate(layer_types) if kind == "conv"],
        attn_implementation="eager",
    )


if __name__ == "__main__":
    main()
