"""RoCBert: BERT's block under its own class names (see ``bert``)."""

from transformers.models.roc_bert import modeling_roc_bert as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("roc_bert",)
ENVOYS = bert.envoys_of(MODELING, "RoCBert")
RENAME = bert.RENAME
TINY_CONFIG = bert.TINY_CONFIG
