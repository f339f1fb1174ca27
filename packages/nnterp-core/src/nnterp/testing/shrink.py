"""Tiny configs for model types no family describes: the type's default config, shrunk.

A family states its ``TINY_CONFIG``; a generic family (a model type served
from the layout of its blocks) has no one to write it, so its tiny config is
the model type's default config with every size it has set small: the
width, depth, heads, vocabulary, experts, and the latent and rotary sizes
that must stay consistent with them. The sizes are the config's own
attributes, found through its ``attribute_map`` (GPT-2's ``n_embd`` is
``hidden_size``), so the result is a dict of the config's own keyword
arguments.

A tiny config builds a block of every kind the config can produce, not
only the kinds its default's first layers happen to have: LFM2's default
lists attention layers only, though its config makes every other layer a
short convolution (:func:`layer_kinds`). A census that shrank to the first
two layers would claim a model whose real checkpoints it refuses.
"""

from __future__ import annotations

import ast
import inspect
import itertools
from typing import Any

from .models import TOKEN_IDS

#: Standard config attribute -> its tiny value. Only those the default config has are set.
TINY_SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "decoder_layers": 2,
    "decoder_attention_heads": 4,
    "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "ffn_hidden_size": 128,
    "vocab_size": 96,
    "max_position_embeddings": 128,
    "sliding_window": 64,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 16,
    "rotary_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
}


#: Config attributes listing a kind per layer (or a pattern of kinds the layers cycle through).
PER_LAYER_KINDS = ("layer_types", "mlp_layer_types", "layers_block_type", "block_types")

#: Sizes set even where the default config holds ``None``, since a model reads them as they are.
REQUIRED_WHEN_PRESENT = ("head_dim", "num_key_value_heads")


def tiny_overrides(model_type: str) -> dict[str, Any]:
    """Keyword arguments for ``AutoConfig.for_model(model_type, ...)`` that shrink every size the config has.

    A size the default config leaves ``None`` stays ``None`` (the model derives
    it), but for the head width and key/value head count (``REQUIRED_WHEN_PRESENT``). Where the config lists a kind per layer
    (``PER_LAYER_KINDS``), the tiny model has a layer of every kind it can
    produce (:func:`layer_kinds`), so it may be deeper than two layers. A multimodal config's sizes are its text config's, and its
    text config takes the local tokenizer's special ids as well.
    """
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    text = config.get_text_config()
    # Read as saved: a config with per-layer sizes refuses to read them as attributes.
    saved = text.to_dict()
    fields = {standard: text.attribute_map.get(standard, standard) for standard in TINY_SIZES}
    overrides = {own: TINY_SIZES[standard] for standard, own in fields.items() if saved.get(own) is not None}
    # A head width the model reads as it is, or a key/value head count left to mean "as many as the queries":
    # set where the config has the key at all (Ministral's head_dim, Nemotron's key/value heads default to None).
    for standard in REQUIRED_WHEN_PRESENT:
        own = fields[standard]
        if own in saved and saved[own] is None:
            overrides[own] = (
                TINY_SIZES[standard] if standard == "head_dim" else overrides.get(fields["num_attention_heads"])
            )
    experts = ("num_experts", "num_local_experts", "n_routed_experts")
    if any(fields[name] in overrides for name in experts) and fields["num_experts_per_tok"] in saved:
        # A mixture with its top-k left unset (DeepSeek-V2's default) routes nowhere.
        overrides[fields["num_experts_per_tok"]] = TINY_SIZES["num_experts_per_tok"]
    heads, kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
    if saved.get(kv_heads) is not None and saved[kv_heads] == saved.get(heads):
        # Multi-head (and latent) attention stays so: its keys may not be repeatable to grouped heads.
        overrides[kv_heads] = overrides[heads]
    layers = overrides.get(fields["num_hidden_layers"], TINY_SIZES["num_hidden_layers"])
    kinds = {name: layer_kinds(text, name) for name in PER_LAYER_KINDS if isinstance(saved.get(name), (list, tuple))}
    if kinds:
        # every kind at least once, the lists as long as one another, cycling where one has fewer kinds
        layers = max(layers, *map(len, kinds.values()))
        for name, listed in kinds.items():
            overrides[name] = list(itertools.islice(itertools.cycle(listed), layers))
        if fields["num_hidden_layers"] in saved:
            overrides[fields["num_hidden_layers"]] = layers
    if text is config:
        return overrides
    return {"text_config": {**text.to_dict(), **TOKEN_IDS, **overrides}}


def layer_kinds(config: Any, name: str) -> list[str]:
    """The kinds of layer ``config``'s per-layer list ``name`` can hold, each once, in the order first met.

    Those its default lists, then the layer kinds transformers knows
    (``ALLOWED_LAYER_TYPES``) that the configuration module's code assigns
    to the list: LFM2's writes ``"conv"`` for every layer not in
    ``full_attn_idxs``, which its default config leaves empty.
    """
    listed = [kind for kind in config.to_dict()[name] if isinstance(kind, str)]
    assigned = _assigned_kinds(type(config), name)
    if getattr(config, "sliding_window", None) is None:
        # a config without a window assigns no sliding layer (GOT-OCR2's, whose cache would need the window)
        assigned = [kind for kind in assigned if "sliding" not in kind]
    return list(dict.fromkeys(listed + assigned))


def _assigned_kinds(config_class: type, name: str) -> list[str]:
    from transformers import configuration_utils

    known = getattr(configuration_utils, "ALLOWED_LAYER_TYPES", ())
    try:
        tree = ast.parse(inspect.getsource(inspect.getmodule(config_class)))
    except (OSError, TypeError):
        return []
    kinds = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(getattr(target, "attr", getattr(target, "id", None)) == name for target in targets):
            kinds += [
                leaf.value for leaf in ast.walk(node.value) if isinstance(leaf, ast.Constant) and leaf.value in known
            ]
    return kinds
