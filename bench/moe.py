"""What reading a mixture of experts' values costs, measured side by side.

A random-weight Qwen3-Next with Qwen3-Next-80B-A3B's routing (512 experts, 10
per token, a gated shared expert) at reduced width and depth (hidden 256,
experts 128 wide, four blocks: three gated-DeltaNet, one attention). Two runs
per prompt length, interleaved so machine noise hits them alike:

- plain: the transformers forward (its default grouped_mm experts);
- values: a trace reading every Moe value on every block: router_logits,
  expert_weights, expert_indices, expert_outputs, routed_output,
  shared_expert_output and mlp_output.

Target: values <= 1.10x plain at 256 and 1024 tokens. It also prints what
``expert_outputs`` holds: the bytes of the storage under the served tensor over
the bytes of the [batch, seq, top_k, hidden] result; 1.00x means it is the
model's own tensor, with no copy of the experts' activations.

    python bench/moe.py [--lengths 256 1024] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import harness
import torch

LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
CONFIG = dict(
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    num_experts=512,
    num_experts_per_tok=10,
    norm_topk_prob=True,
    num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
VALUES = (
    "router_logits",
    "expert_weights",
    "expert_indices",
    "expert_outputs",
    "routed_output",
    "shared_expert_output",
    "mlp_output",
)


def main() -> None:
    options = harness.options(__doc__.splitlines()[0])
    ids = harness.token_ids(options.lengths, CONFIG["vocab_size"])
    plain, traced = harness.twins("qwen3_next", CONFIG)
    model = harness.standardized(traced)
    mixtures = [layer.mlp for layer in model.layers]
    times = harness.medians(
        {"plain": harness.forward(plain, ids), "values": harness.read(model, mixtures, VALUES, ids)},
        options.lengths,
        options.repeats,
    )
    harness.table(
        f"Qwen3-Next MoE, {len(mixtures)} blocks, 512 experts top-10 + shared, hidden 256", times, [("values", "plain")]
    )
    n = options.lengths[0]
    with torch.no_grad(), model.trace(ids[n]):
        outputs = mixtures[0].expert_outputs.save()
    held = outputs.untyped_storage().nbytes() / (outputs.numel() * outputs.element_size())
    print(f"expert_outputs {tuple(outputs.shape)}: storage / result bytes = {held:.2f}x")


if __name__ == "__main__":
    main()
