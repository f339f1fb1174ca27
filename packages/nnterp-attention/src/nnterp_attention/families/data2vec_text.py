"""Data2Vec's text model: BERT's block under its own class names (see ``bert``)."""

from transformers.models.data2vec import modeling_data2vec_text as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("data2vec-text",)
ENVOYS = bert.envoys_of(MODELING, "Data2VecText")
RENAME = bert.RENAME
TINY_CONFIG = bert.TINY_CONFIG
