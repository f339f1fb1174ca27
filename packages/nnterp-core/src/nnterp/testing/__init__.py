"""Testing kit: tiny models built locally, and the conformance suites a family's tests mix in."""

from .assembly import family_suite
from .forward_change import ForwardChangeSuite
from .models import save_tiny, tiny_config, tiny_model, tiny_standardized
from .moe import MoeSuite, draw_selection_bias
from .recurrent import (
    RecurrentMixerSuite,
    check_patch_state_joins_the_prompts,
    check_positions,
    close_relative,
    mild_decays,
)
from .suites import (
    ATOL,
    PROMPT,
    AttentionSuite,
    HyperConnectionSuite,
    LayerSuite,
    Suite,
    block_value,
    blocks_with,
    close,
)
from .tokenizer import local_tokenizer

__all__ = [
    "ATOL",
    "AttentionSuite",
    "ForwardChangeSuite",
    "LayerSuite",
    "HyperConnectionSuite",
    "MoeSuite",
    "PROMPT",
    "RecurrentMixerSuite",
    "Suite",
    "block_value",
    "blocks_with",
    "check_patch_state_joins_the_prompts",
    "check_positions",
    "close",
    "close_relative",
    "draw_selection_bias",
    "family_suite",
    "local_tokenizer",
    "mild_decays",
    "save_tiny",
    "tiny_config",
    "tiny_model",
    "tiny_standardized",
]
