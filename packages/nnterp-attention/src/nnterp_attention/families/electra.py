"""ELECTRA's generator: BERT's block under its own class names (see ``bert``)."""

from transformers.models.electra import modeling_electra as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("electra",)
ENVOYS = bert.envoys_of(MODELING, "Electra")
RENAME = bert.RENAME
#: What the causal LM applies to the last block's output (``nnterp.analysis.lens``): a transform, the unembedding.
HEAD = ("generator_predictions", "generator_lm_head")
TINY_CONFIG = bert.TINY_CONFIG
