"""RemBERT: BERT's block, its attention computing its products itself (see ``bert.ClassicBertAttention``)."""

from transformers.models.rembert import modeling_rembert as MODELING

from nnterp_attention.families import bert

ATTENDS_BOTH_WAYS = bert.DECODER_ATTENDS_BOTH_WAYS
MODEL_TYPES = ("rembert",)
ENVOYS = bert.envoys_of(MODELING, "RemBert", layer=bert.TupleBertLayer, attention=bert.ClassicBertAttention)
RENAME = bert.RENAME
TINY_CONFIG = dict(bert.TINY_CONFIG, input_embedding_size=16, output_embedding_size=16)
