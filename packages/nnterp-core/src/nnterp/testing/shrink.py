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
two layers would claim a model whose real checkpoints it refuses. Each tiny
layer stands for the default's first layer of its kinds, and takes that
layer's entry in every other per-layer setting: a list with an entry per
layer (Gemma-3n's activation sparsity), or overrides keyed by layer index
(Gemma-4's wider global heads), their sizes shrunk as the config's are.
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
    "index_n_heads": 2,
    "index_num_heads": 2,
    "index_head_dim": 16,
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
    experts = [
        fields[name] for name in ("num_experts", "num_local_experts", "n_routed_experts") if fields[name] in saved
    ]
    top_k = fields["num_experts_per_tok"]
    if saved.get(fields["moe_intermediate_size"]) is not None:
        # A mixture whose expert counts the default leaves unset (Dots1's) builds no experts to route to.
        overrides.update({own: TINY_SIZES["num_experts"] for own in experts if saved[own] is None})
        if "n_shared_experts" in saved and saved["n_shared_experts"] is None:
            overrides["n_shared_experts"] = 1
    if any(own in overrides for own in experts) and top_k in saved:
        # A mixture with its top-k left unset (DeepSeek-V2's default) routes nowhere; a model may allow only the
        # top-k it has (ZAYA's one expert per token).
        overrides[top_k] = min(saved[top_k] or TINY_SIZES["num_experts_per_tok"], TINY_SIZES["num_experts_per_tok"])
    _keep_multi_head(saved, overrides, fields)
    nope, rope, head = fields["qk_nope_head_dim"], fields["qk_rope_head_dim"], fields["head_dim"]
    per_layer = [entry for value in saved.values() if isinstance(value, dict) for entry in value.values()]
    unrotated = {saved.get(nope)} | {entry.get(nope) for entry in per_layer if isinstance(entry, dict)}
    if head in overrides and rope in overrides and saved[head] in {part + saved[rope] for part in unrotated if part}:
        # a latent attention's head is its unrotated and rotated parts, on every layer or on some layers (Dots3-Note's
        # sliding ones), and its config may check that
        overrides[head] = TINY_SIZES["qk_nope_head_dim"] + TINY_SIZES["qk_rope_head_dim"]
    default_layers = saved.get(fields["num_hidden_layers"])
    layers = overrides.get(fields["num_hidden_layers"], TINY_SIZES["num_hidden_layers"])
    kinds = {name: layer_kinds(text, name) for name in PER_LAYER_KINDS if isinstance(saved.get(name), (list, tuple))}
    if kinds:
        # every kind at least once, the lists as long as one another, cycling where one has fewer kinds
        layers = max(layers, *map(len, kinds.values()))
        for name, listed in kinds.items():
            overrides[name] = list(itertools.islice(itertools.cycle(listed), layers))
        if fields["num_hidden_layers"] in saved:
            overrides[fields["num_hidden_layers"]] = layers
    if isinstance(default_layers, int):
        overrides.update(_per_layer_settings(saved, overrides, kinds, layers, default_layers, fields))
    if "layer_types" in overrides:
        overrides.update(_rope_per_kind(saved.get("rope_parameters"), overrides["layer_types"]))
    if text is config:
        return overrides
    return {"text_config": {**text.to_dict(), **TOKEN_IDS, **overrides}, **_feeding_the_text(config, text, overrides)}


def _feeding_the_text(config: Any, text: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's other sub-configs, with every size equal to the text model's width set to the tiny width.

    An adapter that feeds the text model is as wide as it, and the config may
    check it (Dots3-Note's vision and audio adapters).
    """
    width = text.attribute_map.get("hidden_size", "hidden_size")
    if width not in overrides:
        return {}
    others = {}
    for name in config.sub_configs:
        sub = getattr(config, name, None)
        if sub is None or sub is text or not hasattr(sub, "to_dict"):
            continue
        saved = sub.to_dict()
        feeding = {key: overrides[width] for key, value in saved.items() if value == getattr(text, width)}
        if feeding:
            others[name] = {**saved, **feeding}
    return others


def _keep_multi_head(sizes: dict[str, Any], overrides: dict[str, Any], fields: dict[str, str]) -> None:
    """Keep multi-head (and latent) attention so in ``overrides``: its keys may not be repeatable to grouped heads."""
    heads, kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
    if sizes.get(kv_heads) is not None and sizes[kv_heads] == sizes.get(heads) and heads in overrides:
        overrides[kv_heads] = overrides[heads]


def _per_layer_settings(
    saved: dict[str, Any],
    overrides: dict[str, Any],
    kinds: dict[str, list[str]],
    layers: int,
    default_layers: int,
    fields: dict[str, str],
) -> dict[str, Any]:
    """The tiny model's entries of the default's other per-layer settings, each tiny layer taking its source's.

    A tiny layer's source is the default's first layer of the same kinds in
    every per-layer kind list (the default's layer at the same index where it
    has none, as for a kind only the config's code assigns). A per-layer
    setting is a list with an entry per default layer, or a dict of overrides
    keyed by layer index. The overrides' sizes are shrunk to the same tiny
    sizes as the config's, so a layer's own width may come out as the rest's:
    the tiny model has every kind of layer, not every width.
    """
    listed = {name: saved[name] for name in kinds if len(saved[name]) == default_layers}
    sources = []
    for index in range(layers):
        wanted = tuple(overrides[name][index] for name in listed)
        same = (layer for layer in range(default_layers) if tuple(saved[name][layer] for name in listed) == wanted)
        sources.append(next(same, index % default_layers))
    settings: dict[str, Any] = {}
    for name, value in saved.items():
        if name in PER_LAYER_KINDS or name in overrides or default_layers <= layers:
            continue
        if isinstance(value, list) and len(value) == default_layers:
            settings[name] = [value[source] for source in sources]
        elif isinstance(value, dict) and value and all(_layer_index(key, default_layers) is not None for key in value):
            by_layer = {_layer_index(key, default_layers): entry for key, entry in value.items()}
            settings[name] = {
                index: _shrunk(by_layer[source], fields)
                for index, source in enumerate(sources)
                if isinstance(by_layer.get(source), dict)
            }
    return settings


def _rope_per_kind(rope: Any, kinds: list[str]) -> dict[str, Any]:
    """Rotary parameters for each kind of layer the tiny model has, where the config keys them by kind and lacks one.

    A config whose rotary embedding reads ``rope_parameters[layer_type]`` may
    leave them empty by default (Cohere-Compass's, which its checkpoints fill
    in): every kind the tiny model builds then gets the default rotation.
    """
    if not isinstance(rope, dict) or not set(rope) <= set(kinds) | set(_known_kinds()):
        return {}
    missing = [kind for kind in dict.fromkeys(kinds) if kind not in rope]
    if not missing:
        return {}
    return {"rope_parameters": {**rope, **{kind: {"rope_type": "default", "rope_theta": 10000.0} for kind in missing}}}


def _known_kinds() -> tuple[str, ...]:
    """The kinds of layer transformers knows (``ALLOWED_LAYER_TYPES``)."""
    from transformers import configuration_utils

    return tuple(getattr(configuration_utils, "ALLOWED_LAYER_TYPES", ()))


def _layer_index(key: Any, layers: int) -> int | None:
    """``key`` as the index of one of ``layers`` layers (Gemma-4 writes ``"05"``), or ``None`` where it is not one."""
    if isinstance(key, str) and key.isdigit():
        key = int(key)
    return key if isinstance(key, int) and 0 <= key < layers else None


def _shrunk(sizes: dict[str, Any], fields: dict[str, str]) -> dict[str, Any]:
    """One layer's overrides with every size among them set tiny, as the whole config's are."""
    tiny = {own: TINY_SIZES[standard] for standard, own in fields.items() if sizes.get(own) is not None}
    _keep_multi_head(sizes, tiny, fields)
    return {**sizes, **tiny}


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
    known = _known_kinds()
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
