"""What reading an RWKV-4 mixer's state after every token costs, measured side by side.

A random-weight RWKV-4 a bit larger than the tests' (hidden size 256, 4 blocks,
vocabulary 1024) on CPU, where transformers runs the WKV as its pure-torch token
loop, routed so that ``states`` can read that loop. Runs per prompt length,
interleaved so machine noise hits them alike:

- plain: the transformers forward;
- trajectory: a trace reading ``state_trajectory`` on every mixer, the state
  after every position computed at once from the kernel call's arguments;
- states: a trace reading ``states`` on every mixer, gathered from the loop
  token by token.

Target: trajectory <= 1.5x plain. Absolute times drift on a shared machine;
the ratios are the result.

    python bench/rwkv.py [--lengths 256 1024] [--repeats 3] [--layers 4] [--threads N]
"""

from __future__ import annotations

import harness

from nnterp.families import rwkv

CONFIG = dict(
    vocab_size=1024,
    hidden_size=256,
    attention_hidden_size=256,
    intermediate_size=1024,
    context_length=2048,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)


def main() -> None:
    options = harness.options(__doc__.splitlines()[0], layers=4)
    harness.mixer_readings(
        options,
        "rwkv",
        {**CONFIG, "num_hidden_layers": options.layers},
        {"trajectory": ["state_trajectory"], "states": ["states"]},
        lambda mixers: f"RWKV-4, {len(mixers)} WKV mixers (256 channels), hidden 256",
        routed=rwkv,
    )


if __name__ == "__main__":
    main()
