"""BERT-generation's decoder: BERT's block under its own class names (see ``bert``)."""

from transformers.models.bert_generation import modeling_bert_generation as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("bert-generation",)
ENVOYS = bert.envoys_of(MODELING, "BertGeneration")
RENAME = bert.RENAME
TINY_CONFIG = bert.TINY_CONFIG
