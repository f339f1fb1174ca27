"""Megatron-BERT: BERT's block with pre-norms (``attention.ln``, ``ln``) and a final norm, its own attention products.

Its block returns the pattern beside the hidden states.
"""

from transformers.models.megatron_bert import modeling_megatron_bert as MODELING

from nnterp import TupleLayer
from nnterp_attention.families import bert


class MegatronBertLayer(bert.PreNormBertLayer, TupleLayer):
    ATTENTION_NORM = "attention.ln"
    MLP_NORM = "ln"


ATTENDS_BOTH_WAYS = bert.DECODER_ATTENDS_BOTH_WAYS
MODEL_TYPES = ("megatron-bert",)
ENVOYS = bert.envoys_of(MODELING, "MegatronBert", layer=MegatronBertLayer, attention=bert.ClassicBertAttention)
RENAME = {**bert.RENAME, "bert.encoder.ln": "ln_final"}
TINY_CONFIG = bert.TINY_CONFIG
