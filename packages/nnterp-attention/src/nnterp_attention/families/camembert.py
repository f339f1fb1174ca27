"""CamemBERT: BERT's block under its own class names (see ``bert``)."""

from transformers.models.camembert import modeling_camembert as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("camembert",)
ENVOYS = bert.envoys_of(MODELING, "Camembert")
RENAME = bert.RENAME
TINY_CONFIG = bert.TINY_CONFIG
