"""RemBERT: BERT's block, its attention computing its products itself (see ``bert.ClassicBertAttention``).

Before transformers 5.20 its model builds a bidirectional mask even configured ``is_decoder=True``: it
attends to later tokens there.
"""

from transformers.models.rembert import modeling_rembert as MODELING

from nnterp_attention.families import bert

MODEL_TYPES = ("rembert",)
ENVOYS = bert.envoys_of(MODELING, "RemBert", layer=bert.TupleBertLayer, attention=bert.ClassicBertAttention)
RENAME = bert.RENAME
TINY_CONFIG = dict(bert.TINY_CONFIG, input_embedding_size=16, output_embedding_size=16)
