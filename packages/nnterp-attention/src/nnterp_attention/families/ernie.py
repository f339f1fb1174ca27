"""ERNIE: BERT's block under its own class names (see ``bert``)."""

from transformers.models.ernie import modeling_ernie as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("ernie",)
ENVOYS = bert.envoys_of(MODELING, "Ernie")
RENAME = bert.RENAME
TINY_CONFIG = bert.TINY_CONFIG
