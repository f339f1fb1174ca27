"""What reading every value costs on a model with offloaded blocks, measured side by side.

A random-weight Qwen3-Next (gated-DeltaNet and attention blocks, a mixture of
experts) at reduced width, saved to a directory and loaded twice with the same
device map: its embedding and half its blocks on the CPU, the other half on
"disk", so each of those blocks loads its weights from the offload folder on
every forward. Two runs per prompt length, interleaved:

- plain: the transformers forward of the offloaded model;
- values: a trace of the offloaded StandardizedTransformer reading, on every
  block, the stream entering and leaving it, every value of its mixer (the
  DeltaNet's kernel values and state, or the attention's interior) and the
  MLP's output.

Target: values <= 1.10x plain.

It then serializes, as nnsight's remote backend sends it to an NDIF server, a
trace reading ten values (every value of a DeltaNet mixer and the stream
around it on the first block); target: <= 64 KiB.

    python bench/scale.py [--lengths 256 1024] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import tempfile

import deltanet
import harness
import torch
from nnsight.schema.request import RequestModel
from nnsight.tracing.backend import Backend
from transformers import AutoModelForCausalLM

from nnterp import StandardizedTransformer
from nnterp.testing import local_tokenizer

LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2
CONFIG = dict(
    vocab_size=1024,
    hidden_size=512,
    intermediate_size=1024,
    moe_intermediate_size=256,
    shared_expert_intermediate_size=256,
    num_experts=16,
    num_experts_per_tok=4,
    num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=8,
    linear_num_value_heads=8,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)
MIXER_VALUES = {
    "linear_attn": deltanet.VALUES,
    "self_attn": (
        "attention_queries",
        "attention_keys",
        "attention_values",
        "attention_scores",
        "attention_probabilities",
        "attention_head_outputs",
        "attention_output",
    ),
}


def device_map(layers: int) -> dict[str, str]:
    """The embedding, the final norm, the head and the even blocks on the CPU; the odd blocks on disk."""
    blocks = {f"model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(layers)}
    return {"model.embed_tokens": "cpu", **blocks, "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}


def read_everything(model: StandardizedTransformer, ids: dict[int, torch.Tensor]) -> harness.Run:
    """A trace reading each block's stream, its mixer's values and its MLP's output, in the forward's order."""

    def run(n: int) -> None:
        with torch.no_grad(), model.trace(ids[n]):
            for layer in model.layers:
                layer.layer_input.save()
                kind = "linear_attn" if getattr(layer, "linear_attn", None) is not None else "self_attn"
                mixer = getattr(layer, kind)
                for name in MIXER_VALUES[kind]:
                    value = getattr(mixer, name)
                    if value is not None:
                        value.save()
                layer.mlp.mlp_output.save()
                layer.layer_output.save()

    return run


class Serialized(Backend):
    """Serializes a trace as the remote backend sends it, and runs nothing."""

    def __init__(self, model: StandardizedTransformer) -> None:
        self.remote = model._remote_backend(True, True, None, False)
        self.sent = self.raw = b""

    def __call__(self, tracer) -> None:
        self.sent = self.remote._serialize(tracer)
        self.raw = RequestModel.serialize(tracer, compress=False)


def request_size(model: StandardizedTransformer, ids: torch.Tensor) -> Serialized:
    """The request of a trace reading ten values of the first block."""
    request = Serialized(model)
    layer = model.layers[0]
    with model.trace(ids, backend=request):
        layer.layer_input.save()
        for name in MIXER_VALUES["linear_attn"][:8]:
            getattr(layer.linear_attn, name).save()
        layer.layer_output.save()
    return request


def main() -> None:
    options = harness.options(__doc__.splitlines()[0])
    ids = harness.token_ids(options.lengths, CONFIG["vocab_size"])
    (source,) = harness.twins("qwen3_next", CONFIG, copies=1)
    with tempfile.TemporaryDirectory() as directory:
        source.save_pretrained(directory)
        placement = dict(device_map=device_map(len(LAYER_TYPES)), attn_implementation="eager")
        plain = AutoModelForCausalLM.from_pretrained(directory, offload_folder=f"{directory}/plain", **placement)
        model = StandardizedTransformer(
            directory,
            tokenizer=local_tokenizer(CONFIG["vocab_size"]),
            offload_folder=f"{directory}/values",
            **placement,
        )
        times = harness.medians(
            {"plain": harness.forward(plain.eval(), ids), "values": read_everything(model, ids)},
            options.lengths,
            options.repeats,
        )
        request = request_size(model, ids[options.lengths[0]])
    harness.table(
        f"Qwen3-Next, {len(LAYER_TYPES)} blocks (half on disk), hidden {CONFIG['hidden_size']}, every value",
        times,
        [("values", "plain")],
    )
    print(
        f"remote request reading 10 values: {len(request.sent) / 1024:.1f} KiB as sent "
        f"({'zstd' if request.remote.compress else 'uncompressed'}), {len(request.raw) / 1024:.1f} KiB uncompressed"
    )


if __name__ == "__main__":
    main()
