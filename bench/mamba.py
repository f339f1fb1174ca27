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

import harness

from nnterp.families import mamba

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


def main() -> None:
    options = harness.options(__doc__.splitlines()[0], layers=4)
    harness.mixer_readings(
        options,
        "mamba",
        {**CONFIG, "num_hidden_layers": options.layers},
        {"values": VALUES, "states": ["states"]},
        lambda mixers: f"Mamba-1, {len(mixers)} mixers (1536 channels x state 16), hidden 768",
        routed=mamba,
    )


if __name__ == "__main__":
    main()
