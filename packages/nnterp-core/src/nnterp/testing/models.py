"""Tiny random-weight models of a family, built and saved locally."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch

from ..family import declared
from ..registry import REGISTRY
from ..transformer import StandardizedTransformer, register_causal_lm
from .tokenizer import local_tokenizer

TOKEN_IDS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)


def _family(family: str | ModuleType) -> ModuleType:
    return REGISTRY.family(family) if isinstance(family, str) else family


def tiny_config(family: str | ModuleType, **overrides: Any) -> Any:
    """The family's tiny config, with the local tokenizer's special ids and any ``overrides``."""
    from transformers import AutoConfig

    family = _family(family)
    return AutoConfig.for_model(family.MODEL_TYPES[0], **{**TOKEN_IDS, **family.TINY_CONFIG, **overrides})


def tiny_model(family: str | ModuleType, attn_implementation: str = "eager", seed: int = 0, **overrides: Any) -> Any:
    """A random-weight causal LM of the family from its tiny config, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    # A dtype on a multimodal wrapper's config would not reach its text model: from_config casts the whole model.
    dtype = overrides.pop("dtype", None)
    config = tiny_config(family, **overrides)
    register_causal_lm(_family(family), config)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype).eval()
    tiny_weights = declared(_family(family)).tiny_weights
    if tiny_weights is not None:
        tiny_weights(model)
    return model


def save_tiny(family: str | ModuleType, directory: str | os.PathLike, **kwargs: Any) -> str:
    """Save a tiny model of the family and the local tokenizer to ``directory``; returns it.

    ``StandardizedTransformer(directory)`` then loads it through the same code
    a hub id takes.
    """
    model = tiny_model(family, **kwargs)
    vocab_size = model.config.get_text_config().vocab_size
    model.save_pretrained(directory)
    local_tokenizer(vocab_size).save_pretrained(directory)
    return os.fspath(directory)


def tiny_standardized(
    family: str | ModuleType, attn_implementation: str = "eager", **kwargs: Any
) -> StandardizedTransformer:
    """A tiny model of the family under the standard names, with the local tokenizer."""
    model = tiny_model(family, attn_implementation=attn_implementation, **kwargs)
    vocab_size = model.config.get_text_config().vocab_size
    return StandardizedTransformer(model, tokenizer=local_tokenizer(vocab_size))
