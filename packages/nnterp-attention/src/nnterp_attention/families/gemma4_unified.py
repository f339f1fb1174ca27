"""Gemma-4 Unified: an encoder-free wrapper over Gemma-4 Unified's text model, served for text.

transformers maps the type's causal LM to the wrapper
(``Gemma4UnifiedForConditionalGeneration``), whose text model is
``model.language_model``: its blocks are the ``gemma4_unified_text`` family's.

The wrapper has no vision tower: ``model.embed_vision`` embeds each raw patch
with layer norms, one linear map and a position embedding, and projects it
straight into the text model's width, one image token per patch. nnterp's
image values describe a tower of blocks (``vision.layers[i]``,
``tower_output``) and where its features are scattered into the text, so this
family names no tower and serves the text model alone (``NO_TOWER``): a
checkpoint loads as text, whatever processor it saves.
"""

from . import gemma4_unified_text

#: Why no image value is served.
NO_TOWER = (
    "Gemma-4 Unified has no vision tower: model.embed_vision projects each raw patch into the text model's width "
    "with no blocks, which nnterp's vision values (a tower's blocks, tower_output) do not describe; the checkpoint "
    "is served for text"
)
MODEL_TYPES = ("gemma4_unified",)
ENVOYS = dict(gemma4_unified_text.ENVOYS)
RENAME = dict(gemma4_unified_text.RENAME)
TINY_CONFIG = dict(
    text_config={**gemma4_unified_text.TINY_CONFIG, "model_type": "gemma4_unified_text"},
    # A patch of 2 x 2 pixels pooled 2 x 2: the embedder's input is a 4 x 4 patch.
    vision_config=dict(patch_size=2, pooling_kernel_size=2, mm_embed_dim=16, mm_posemb_size=32, output_proj_dims=16),
    audio_config=None,
)
