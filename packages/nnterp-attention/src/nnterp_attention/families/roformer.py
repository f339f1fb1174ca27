"""RoFormer: BERT's block with rotary positions, its attention computing its products itself (see ``bert``)."""

from transformers.models.roformer import modeling_roformer as MODELING

from nnterp_attention.families import bert

ATTENDS_BOTH_WAYS = bert.DECODER_ATTENDS_BOTH_WAYS
MODEL_TYPES = ("roformer",)
ENVOYS = bert.envoys_of(MODELING, "RoFormer", layer=bert.TupleBertLayer, attention=bert.ClassicBertAttention)
RENAME = bert.RENAME
TINY_CONFIG = dict(bert.TINY_CONFIG, embedding_size=32)
