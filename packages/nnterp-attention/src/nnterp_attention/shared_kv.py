"""Blocks that attend over an earlier block's keys and values (Gemma-3n's and Gemma-4's ``num_kv_shared_layers``)."""

from __future__ import annotations

from typing import Any


def refuse_skipping_a_kv_source(layer: Any) -> None:
    """Raise where later blocks reuse the keys and values of ``layer`` (a block envoy), which a skipped block lacks.

    Raises:
        ValueError: ``layer``'s attention keeps its keys and values for the
            last ``config.num_kv_shared_layers`` blocks of its type.
    """
    attention = layer._module.self_attn
    readers = [
        i
        for i, block in enumerate(layer.parent._module)
        if block.self_attn.is_kv_shared_layer and block.self_attn.layer_type == attention.layer_type
    ]
    if attention.store_full_length_kv and readers:
        raise ValueError(
            f"{layer.path} cannot be skipped: blocks {readers} attend over its keys and values "
            f"(config.num_kv_shared_layers), which a skipped block does not compute"
        )
