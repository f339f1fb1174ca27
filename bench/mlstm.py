"""What reading an mLSTM layer's values and its state after every token costs, measured side by side.

A random-weight xLSTM a bit larger than the tiny one (hidden size 256, 4 heads
of 32 key and 64 value dimensions, a few blocks), its prompts running through
the backend's chunkwise kernel in chunks of 64 tokens as transformers runs a
long prompt. Three runs per prompt length, interleaved so machine noise hits
them alike:

- plain: the transformers forward;
- values: a trace reading every MatrixMemory value of the call's arguments and results on every layer;
- states: a trace reading ``state_trajectory`` (the memory after every token) on every layer.

Named for the layer, not the model: a ``bench/xlstm.py`` would be found as the
``xlstm`` package by transformers' availability check while any script in
``bench/`` runs, and transformers would then import it in place of the real one.

Target: states <= 1.5x plain at 1024 tokens. Absolute times drift on a shared
machine; the ratios are the result.

    python bench/mlstm.py [--lengths 256 1024] [--repeats 3] [--layers 4] [--threads N]
"""

from __future__ import annotations

import harness

CONFIG = dict(
    vocab_size=1024,
    hidden_size=256,
    num_heads=8,
    qk_dim_factor=0.5,
    v_dim_factor=1.0,
    chunk_size=64,
    autocast_kernel_dtype="float32",
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
VALUES = (
    "attention_queries",
    "attention_keys",
    "attention_values",
    "input_gates",
    "forget_gates",
    "state_input",
    "attention_head_outputs",
    "output_gates",
    "state_output",
    "normalizer_output",
    "stabilizer_output",
    "attention_output",
)


def main() -> None:
    options = harness.options(__doc__.splitlines()[0], layers=4)
    harness.mixer_readings(
        options,
        "xlstm",
        {**CONFIG, "num_hidden_layers": options.layers},
        {"values": VALUES, "states": ["state_trajectory"]},
        lambda mixers: f"xLSTM, {len(mixers)} mLSTM layers (8 heads, 16 x 32 memories), hidden 256",
    )


if __name__ == "__main__":
    main()
