"""RoBERTa: BERT's block under its own class names (see ``bert``)."""

from transformers.models.roberta import modeling_roberta as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("roberta",)
ENVOYS = bert.envoys_of(MODELING, "Roberta")
RENAME = bert.RENAME
TINY_CONFIG = bert.TINY_CONFIG
