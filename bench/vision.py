"""What reading a vision tower's values costs, measured side by side.

A random-weight Qwen2.5-VL (its windowed ViT, merger and M-RoPE text model) at
reduced width and depth, on one prompt carrying two images of different sizes.
Two runs, interleaved so machine noise hits them alike:

- plain: the transformers forward on the processor's output;
- values: a trace reading every tower value, in the order the forward makes
  them (patch_embeddings; on every block layer_input, the attention's
  queries, keys, values, head outputs and output, mlp_output, layer_output;
  tower_output), then image_features and image_token_mask at the scatter.

Both run eager attention, which the attention's interior is read inside.
Target: values <= 1.10x plain.

    python bench/vision.py [--sizes 224x224 168x336] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse

import harness
import torch

from nnterp import StandardizedTransformer
from nnterp.families import qwen2_5_vl
from nnterp.testing import tiny_config
from nnterp.testing.vision import tiny_images, tiny_processor, vision_tokenizer

VISION = dict(depth=8, hidden_size=512, intermediate_size=1368, out_hidden_size=512, num_heads=8, window_size=112)
TEXT = dict(
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]},  # halves of a 64-wide head
)
INTERIOR = ("attention_queries", "attention_keys", "attention_values", "attention_head_outputs")


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["224x224", "168x336"], help="each image's HEIGHTxWIDTH")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parsed = parser.parse_args()
    if parsed.threads:
        torch.set_num_threads(parsed.threads)
    return parsed


def model() -> StandardizedTransformer:
    from transformers import AutoModelForImageTextToText

    base = qwen2_5_vl.TINY_CONFIG
    image_token_id = vision_tokenizer(qwen2_5_vl).convert_tokens_to_ids(qwen2_5_vl.IMAGE_TOKENS[0])
    config = tiny_config(
        qwen2_5_vl,
        image_token_id=image_token_id,
        text_config={**base["text_config"], **TEXT},
        vision_config={**base["vision_config"], **VISION},
    )
    torch.manual_seed(0)
    module = AutoModelForImageTextToText.from_config(config, attn_implementation="eager").eval()
    processor = tiny_processor(qwen2_5_vl)
    # Keep the images at their own sizes (the tiny processor shrinks them to a few merged squares).
    processor.image_processor.min_pixels = processor.image_processor.size["shortest_edge"] = 28 * 28
    processor.image_processor.max_pixels = processor.image_processor.size["longest_edge"] = 1024 * 1024
    return StandardizedTransformer(module, processor=processor)


def main() -> None:
    args = options()
    vlm = model()
    sizes = [tuple(int(side) for side in size.split("x")) for size in args.sizes]
    prompt = "Compare " + " and ".join([qwen2_5_vl.IMAGE_PROMPT] * len(sizes)) + "."
    inputs = vlm.processor(text=prompt, images=tiny_images(*sizes), return_tensors="pt")
    patches = int(inputs["image_grid_thw"].prod(-1).sum())

    def plain(_: int) -> None:
        with torch.no_grad():
            vlm._module(**inputs)

    def values(_: int) -> None:
        vision = vlm.vision
        with torch.no_grad(), vlm.trace(inputs):
            vision.patch_embeddings.save()
            for layer in vision.layers:
                layer.layer_input.save()
                for name in INTERIOR:
                    getattr(layer.self_attn, name).save()
                layer.self_attn.attention_output.save()
                layer.mlp.mlp_output.save()
                layer.layer_output.save()
            vision.tower_output.save()
            vision.image_features.save()
            vision.image_token_mask.save()

    times = harness.medians({"plain": plain, "values": values}, [patches], args.repeats)
    plain_time, values_time = times["plain", patches], times["values", patches]
    print(
        f"Qwen2.5-VL tower ({VISION['depth']} blocks, width {VISION['hidden_size']}), {len(sizes)} images "
        f"({patches} patches), {torch.get_num_threads()} thread(s), median (seconds)"
    )
    print(f"{'plain':>8} {'values':>8} {'values/plain':>14}")
    print(f"{plain_time:>8.3f} {values_time:>8.3f} {values_time / plain_time:>13.2f}x")


if __name__ == "__main__":
    main()
