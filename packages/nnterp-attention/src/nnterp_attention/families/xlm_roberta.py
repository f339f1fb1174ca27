"""XLM-RoBERTa: BERT's block under its own class names (see ``bert``)."""

from transformers.models.xlm_roberta import modeling_xlm_roberta as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("xlm-roberta",)
ENVOYS = bert.envoys_of(MODELING, "XLMRoberta")
RENAME = bert.RENAME
TINY_CONFIG = bert.TINY_CONFIG
