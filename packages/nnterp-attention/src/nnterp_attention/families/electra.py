"""ELECTRA's generator: BERT's block under its own class names (see ``bert``)."""

from transformers.models.electra import modeling_electra as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("electra",)
ENVOYS = bert.envoys_of(MODELING, "Electra")
RENAME = bert.RENAME
TINY_CONFIG = bert.TINY_CONFIG
