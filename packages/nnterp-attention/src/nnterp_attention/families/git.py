"""GIT's text decoder: BERT's block, its attention computing its products itself (see ``bert.ClassicBertAttention``)."""

from transformers.models.git import modeling_git as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("git",)
ENVOYS = bert.envoys_of(MODELING, "Git", attention=bert.ClassicBertAttention)
RENAME = bert.RENAME
#: What the causal LM applies to the last block's output (``nnterp.analysis.lens``): its unembedding, ``output``.
HEAD = ("output",)
TINY_CONFIG = dict(
    bert.TINY_CONFIG,
    vision_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=32, patch_size=16
    ),
)
